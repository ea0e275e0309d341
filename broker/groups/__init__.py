"""Consumer groups: `group.py` is a classic group's state machine, `consumer_group.py` a KIP-848
consumer group's (with `assignors.py`, its server-side assignors), `state.py` their stored form,
`coordinator.py` which broker owns a group and the operations handlers call."""
