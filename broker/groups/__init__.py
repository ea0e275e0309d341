"""Classic (pre-KIP-848) consumer groups: `group.py` is one group's state machine, `state.py` its
stored form, `coordinator.py` which broker owns a group and the operations handlers call."""
