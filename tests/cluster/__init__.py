"""Acceptance tests of the leaderless cluster (issue 3): several `neve broker` processes over one
real etcd and one real SeaweedFS, driven by librdkafka producers and checked record by record."""
