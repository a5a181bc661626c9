#!/usr/bin/env bash
# DeepSpeed's own unit tests against zspeed on the CPU (see README.md here).
#   scripts/ds-suite/run.sh DEEPSPEED_CHECKOUT WORKDIR [pytest args...]
# DEEPSPEED_CHECKOUT: a DeepSpeed source tree with tests/ (git clone of deepspeedai/DeepSpeed).
# WORKDIR: where the adapted copy of tests/ goes (recreated). The pytest args default to the
# parts of the suite that cover what zspeed offers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
ds="$1"; work="$2"; shift 2
py="${PYTHON:-$repo/.venv/bin/python}"
mkdir -p "$work/site"
# ZSPEED_AS_DEEPSPEED=1 acts through the wheel's .pth; with the source tree on PYTHONPATH a
# sitecustomize does the same.
cat > "$work/site/sitecustomize.py" <<'PY'
import os
if os.environ.get("ZSPEED_AS_DEEPSPEED", "").strip() not in ("", "0"):
    import zspeed._as_deepspeed  # noqa: F401
PY
export PYTHONPATH="$repo/python:$work/site${PYTHONPATH:+:$PYTHONPATH}"
export ZSPEED_AS_DEEPSPEED=1
# DeepSpeed's DistributedTest skips multi-rank tests unless the accelerator reports that many
# devices; zspeed's CPU accelerator reports LOCAL_SIZE.
export LOCAL_SIZE="${LOCAL_SIZE:-4}"
# A multi-rank test that fails on one rank leaves the others waiting in a collective:
# DeepSpeed's harness gives up after DS_UNITTEST_TIMEOUT seconds (its default, 600, is long).
export DS_UNITTEST_TIMEOUT="${DS_UNITTEST_TIMEOUT:-180}"
"$py" "$here/adapt.py" "$ds/tests" "$work/tests" > "$work/adapt.log"
cd "$work/tests"
if [ $# -eq 0 ]; then
  set -- unit/runtime unit/checkpoint unit/v1/zero unit/v1/half_precision unit/utils
fi
timeout_arg=()
"$py" -c "import pytest_timeout" 2>/dev/null && timeout_arg=(--timeout 300)
exec "$py" -m pytest -p no:cacheprovider -rA --tb=line --continue-on-collection-errors "${timeout_arg[@]}" "$@"
