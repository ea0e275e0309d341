"""AlterUserScramCredentials (key 51), v0 (KIP-554): deletes and upserts SCRAM credentials. The
client sends the salted password, never the password; the broker stores the stored and server
keys derived from it. One result per user named, in the order first named; a user's changes are
applied together or not at all, and every accepted user's changes in one metadata write, so every
broker sees them at once. Refusals as Kafka's: UNSUPPORTED_SASL_MECHANISM for an unknown mechanism,
UNACCEPTABLE_CREDENTIAL for an empty user name or iterations outside 4096-16384 (or a salt too
short to authenticate with), DUPLICATE_RESOURCE for the same user and mechanism twice in one
request, RESOURCE_NOT_FOUND for deleting a credential that does not exist. Needs ALTER on the
cluster (CLUSTER_AUTHORIZATION_FAILED otherwise)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from auth.credentials import MECHANISM_NAMES, UnacceptableCredential, check_user_name, credential_from_salted_password
from metadata.store import MAX_SECURITY_WRITE_KEYS, MetadataError

from ..codec import NO_THROTTLE, build
from ..registry import handles
from ..scram_admin import cluster_allowed, scram_credentials


@handles(51, "AlterUserScramCredentials", 0, 0)
async def alter_user_scram_credentials(ctx, request):
    r = ctx.response
    changes = [*request.deletions, *request.upsertions]
    order = list(dict.fromkeys(c.name for c in changes))
    if not cluster_allowed(ctx, "ALTER"):
        return _response(r, {name: (ErrorCode.cluster_authorization_failed, None) for name in order})
    store = scram_credentials(ctx.services)
    errors: dict[str, tuple[ErrorCode, str]] = {}
    upserts, deletions = {}, set()
    seen: set[tuple[str, int]] = set()
    for change in changes:
        name = change.name
        pair = (name, change.mechanism)
        duplicate = pair in seen
        seen.add(pair)
        if name in errors:
            continue
        mechanism = MECHANISM_NAMES.get(change.mechanism)
        if duplicate:
            errors[name] = (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
            continue
        try:
            check_user_name(name)
        except UnacceptableCredential as e:
            errors[name] = (ErrorCode.unacceptable_credential, str(e))
            continue
        if mechanism is None:
            errors[name] = (ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {change.mechanism}")
        elif hasattr(change, "salted_password"):
            try:
                upserts[(mechanism, name)] = credential_from_salted_password(mechanism, change.salt, change.iterations, change.salted_password)
            except UnacceptableCredential as e:
                errors[name] = (ErrorCode.unacceptable_credential, str(e))
        elif store.lookup(mechanism, name) is None:
            errors[name] = (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
        else:
            deletions.add((mechanism, name))
    outcome: dict[str, tuple[ErrorCode, str | None]] = {name: errors.get(name, (ErrorCode.none, None)) for name in order}
    # A user's changes go in one write; users in as few writes as the store takes (a user has
    # at most one key per mechanism).
    accepted = [name for name in order if name not in errors]
    per_write = MAX_SECURITY_WRITE_KEYS // len(MECHANISM_NAMES)
    for batch in (set(accepted[i : i + per_write]) for i in range(0, len(accepted), per_write)):
        try:
            await store.write({(m, n): c for (m, n), c in upserts.items() if n in batch}, {(m, n) for m, n in deletions if n in batch})
        except (MetadataError, ValueError) as e:
            code = e.error_code if isinstance(e, MetadataError) else ErrorCode.unacceptable_credential
            for name in batch:
                outcome[name] = (code, f"The credentials could not be stored: {e}")
    return _response(r, outcome)


def _response(r, outcome):
    results = tuple(build(r.AlterUserScramCredentialsResult, user=name, error_code=code, error_message=message) for name, (code, message) in outcome.items())
    return build(r.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE, results=results)
