"""A toy third family that pins the family contract (core/family.py): its DSL (``dsl.py``) "compiles" a
spec into a file; the family (``family.py``) plans, builds in helpers, loads, records and replays it."""

from jit_ahead.registry import FamilyInfo

# what a package names under the jit_ahead.families entry-point group, in a module that imports little
INFO = FamilyInfo("toy", "tests.toy.family:ToyFamily", triggers=("tests.toy.dsl",), misses_are_calls=True)
