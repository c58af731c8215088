"""Hermes Agent compatibility: its synchronous store API (`state.hermes.compat`), its row shapes,
the rows it writes into a shared state.db, and importing its state.db."""
