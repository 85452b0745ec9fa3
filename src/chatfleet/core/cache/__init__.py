"""The prefix cache's working set on multi-turn traces (`chatfleet cache`), pure parts.

- `trace`: turns, synthetic multi-turn traces, token ids for traces known by their counts;
- `replay`: what a replay records about each turn beside the engine model (the unbounded
  pool's ceiling, the working set) and what it returns;
- `recommend`: summaries per configuration and the method's recommendation.

The replay itself runs the twin's scheduler in virtual time, a shell: `twin/cache_replay.py`.
"""
