"""Kafka transactions: the leaderless coordinator (`coordinator.py`) over the transaction state
the metadata store keeps (`state.py`), and the markers that end a transaction on its partitions
(`markers.py`). The sequencer (metadata/sequencer.py) tracks each partition's open transactions
and aborted ranges from the batches and markers stored."""
