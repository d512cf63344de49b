"""Entry points of jit_ahead's helper subprocesses (installed as ``jit_ahead_helpers``)."""
