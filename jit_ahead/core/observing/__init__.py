"""Observing: the declared stats events, the stats every part reports to and its log, jit_ahead's own CPU
time, and the few lines a person must see."""
