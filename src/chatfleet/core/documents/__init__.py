"""What chatfleet writes, typed: the chatfleet.sweep/1 document (`sweep`), the plan (`plan`)
and the cache analysis (`cache`). `to_json` / `from_json` live here and only here: producers
build these types, consumers read their attributes, and the files keep their keys, key order
and number formatting (`fields` says how)."""
