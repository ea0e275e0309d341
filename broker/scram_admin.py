"""What the SCRAM credential admin APIs (DescribeUserScramCredentials, AlterUserScramCredentials)
share: the credential store they read and write, and their authorization on the cluster."""

from __future__ import annotations

from auth.acls import Operation
from auth.credentials import ScramCredentials

from .authorization import CLUSTER, allowed


def scram_credentials(services) -> ScramCredentials:
    """The SASL mechanisms' store where SCRAM is offered (its view is already built), else one over
    the metadata store: users can be created before any listener offers SCRAM."""
    sasl = services.sasl
    if sasl is not None and sasl.credentials is not None:
        return sasl.credentials
    return ScramCredentials(services.metadata)


def cluster_allowed(ctx, operation: str) -> bool:
    """Whether the connection's principal may `operation` ("DESCRIBE" or "ALTER") the cluster, as
    Kafka checks these APIs; without an authorizer every request is allowed."""
    return allowed(ctx, Operation[operation], CLUSTER)
