"""Agent backends and the tools they may call."""
