"""The twin: the engine model driven in virtual time."""
