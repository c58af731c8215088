"""The adapter kit: small helpers for what every platform adapter repeats. `typing` keeps a
typing indicator alive while a turn runs; `webhook` hands a webhook's messages to the core
and answers the platform only after they were committed; `lifecycle` starts a webhook
adapter and names the state and last error /health shows; `chats` answers how a platform's
chats take a handoff (`NoThreads`, `DirectOnly`, `OpensThreads`) and checks credentials by
asking the platform who they belong to (`AsksWhoami`), as bases an adapter names."""
