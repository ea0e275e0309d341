"""Serving fetches: the writing broker's recent objects, a byte-bounded LRU, and (later) the
per-zone distributed cache. Depends only on wal."""
