"""Tools the agent may call; each returns JSON text and never raises to the model."""
