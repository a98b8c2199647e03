#!/usr/bin/env bash
# Levee's benchmark suite (figures 1-7 of BENCHMARKS.md) in one command.
#   bench/run.sh            full pass (~10 min)
#   bench/run.sh --quick    ~2 min
#   bench/run.sh --help     every option
# Everything it starts is stopped on exit (the runner traps EXIT, INT, TERM and HUP).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 bench/run.py "$@"
