"""Planning: a planning run over a model within the engine's limits (``run.py``), the planner processes it
forks and the chunks of launches they share (``planners.py``), batches of calls in forked processes, saved
plans, the limits themselves, and what "ready" means while a plan is built."""
