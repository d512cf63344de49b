"""The CuTe DSL family: ``cute.compile`` variants built ahead by CPU-only helpers, exported as objects and
loaded by the executor with ``cute.runtime.load_module``. Needs ``pip install jit_ahead[cute-dsl]``."""
