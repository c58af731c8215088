"""Where a key's work may run: one daemon (the in-process key lock, no fence) or several
replicas (key leases with fences on PostgreSQL). The pipeline sees a topology only through
what a turn carries, its `TurnLease`."""
