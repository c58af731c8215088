"""The adapter kit: small helpers for what every platform adapter repeats. `typing` keeps a
typing indicator alive while a turn runs, `webhook` hands a webhook's messages to the core
and answers the platform only after they were committed, `status` holds an adapter's state
and last error for /health. An adapter uses what it needs; there is no base class."""
