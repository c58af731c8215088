"""Where a key's work may run: one daemon (`LocalTopology`: the in-process key lock, no
fence) or several replicas (`ReplicatedTopology`: key leases with fences on PostgreSQL).
The pipeline sees a topology only through the `Topology` protocol (gateway.topology.base)
and what a turn carries, its `TurnLease`. The parts both are built from live here too:
the in-process coordinator (coordinator.py), what replicas add to it (leases.py), its
PostgreSQL form (cluster.py) and the replicas' shared route table (routes.py)."""
