"""A toy third family that pins the family contract (core/family.py): its DSL (``dsl.py``) "compiles" a
spec into a file; the family (``family.py``) plans, builds in helpers, loads, records and replays it."""
