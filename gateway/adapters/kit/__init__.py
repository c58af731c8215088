"""The adapter kit: small helpers for what every platform adapter repeats. `typing` keeps a
typing indicator alive while a turn runs; `webhook` hands a webhook's messages to the core
and answers the platform only after they were committed; `lifecycle` starts a webhook
adapter and names the state and last error /health shows. There is no base class."""
