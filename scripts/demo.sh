#!/usr/bin/env bash
# The body of `make demo` (after set-up, build and the report): train a small
# GPT with ZeRO-Offload on the bundled corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
echo
echo "== training a small GPT on Pride and Prejudice with ZeRO-Offload (examples/demo_train.py) =="
# torch's OpenMP threads must not spin while zspeed's optimizer threads work.
OMP_WAIT_POLICY=PASSIVE "$PY" examples/demo_train.py "$@"
