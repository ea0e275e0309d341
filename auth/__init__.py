"""Who a client is and what it may do: TLS contexts and certificate principals, SASL mechanisms
(PLAIN, SCRAM, OAUTHBEARER), SCRAM credentials and ACLs kept in the metadata store, and the
authorizer the broker asks. Used by the broker and the schema registry; depends on metadata only."""
