"""`chatfleet gateway`: caps at the knee, sessions where their cache is, the shared prompt
byte-identical. The decisions are `core/fleet`'s (shared with the twin); this package is the
shell: HTTP front (aiohttp), upstream pass-through relay, health, metrics, configuration."""
