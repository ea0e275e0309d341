"""Cluster metadata: the sequencer (offset assignment), the offset index, topics, producer state.
One interface (store.py), two backends (embedded for the single node, etcd for production).
Depends on no other neve package."""
