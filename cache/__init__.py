"""Serving fetches: the writing broker's recent objects, a byte-bounded LRU, and the per-zone
distributed chunk cache (chunks.py, peers.py). Depends only on wal."""
