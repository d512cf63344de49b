"""Hook points in engines and model libraries for the ``JIT_AHEAD=1`` path (no code change)."""
