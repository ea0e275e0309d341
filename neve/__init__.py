"""The composition root: configuration, the `neve` command line, and the wiring of one node."""
