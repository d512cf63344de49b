#!/usr/bin/env python3
"""Coverage report from a jit_ahead stats log: ``python scripts/jit_coverage.py STATS_LOG [--html OUT]``
(the same as ``jit-ahead report``)."""
import sys

from jit_ahead.cli import main

if __name__ == "__main__":
    sys.exit(main(["report", *sys.argv[1:]]))
