"""The pure core: deterministic, no I/O, no clocks. Time is a `now` argument, randomness a
`random.Random` passed in. An import-linter contract (pyproject.toml) keeps it that way."""
