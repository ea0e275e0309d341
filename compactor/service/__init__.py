"""The running service: the single owner of every topic's table, its cycle loop, the tables it
creates and evolves, and the topics it shares with other compactors."""
