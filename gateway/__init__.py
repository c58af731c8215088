"""switchboard's daemon: adapters, router, commands, agent backends, reset policies."""
