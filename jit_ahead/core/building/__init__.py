"""Building: the request table, the helper pool and its helpers (how they start, what they are sent, the fork
server), what a launch does on a miss (the executor side and the pool's answer), build locks and measured
build times, and the DSL cache files helpers write and the executor reads."""
