#!/usr/bin/env bash
# Hugging Face's own DeepSpeed tests (transformers' tests/deepspeed/test_deepspeed.py, accelerate's
# tests/deepspeed/) against zspeed or against a real DeepSpeed, offline (see README.md here).
#   scripts/hf-suite/run.sh zspeed|deepspeed SUITE_DIR [pytest args...]
# SUITE_DIR: a folder holding the tests/ tree of transformers or accelerate (README.md: which files).
# deepspeed: a real DeepSpeed must be importable from $REALDS (default /tmp/realds, a pip --target folder).
# Pytest plugins of plugins/ are opt-in: add e.g. -p cpu_ungate -p zerodim_compat to the pytest args.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
side="$1"; suite="$(cd "$2" && pwd)"; shift 2
py="${PYTHON:-$repo/.venv/bin/python}"
work="${HF_SUITE_WORK:-/tmp/hf-suite-work}"
mkdir -p "$work/site" "$suite/src"  # (transformers' TestCasePlus looks for the repository's src/)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME="$work/hf_home"
[ -e "$HF_HOME/.standins" ] || { "$py" "$here/make_standins.py" > "$work/standins.log" && touch "$HF_HOME/.standins"; }
case "$side" in
  zspeed)
    # ZSPEED_AS_DEEPSPEED=1 acts through the wheel's .pth; with the source tree on PYTHONPATH a
    # sitecustomize does the same (as scripts/ds-suite/run.sh).
    cat > "$work/site/sitecustomize.py" <<'PY'
import os
if os.environ.get("ZSPEED_AS_DEEPSPEED", "").strip() not in ("", "0"):
    import zspeed._as_deepspeed  # noqa: F401
PY
    export ZSPEED_AS_DEEPSPEED=1
    export PYTHONPATH="$repo/python:$work/site:$here/plugins:$suite${PYTHONPATH:+:$PYTHONPATH}";;
  deepspeed)
    realds="${REALDS:-/tmp/realds}"
    export PATH="$realds/bin:$PATH" PYTHONPATH="$realds:$here/plugins:$suite${PYTHONPATH:+:$PYTHONPATH}";;
  *) echo "run.sh: the first argument is zspeed or deepspeed, not '$side'" >&2; exit 2;;
esac
cd "$suite"
timeout_arg=()
"$py" -c "import pytest_timeout" 2>/dev/null && timeout_arg=(--timeout 600)
exec "$py" -m pytest -p no:cacheprovider -rA --tb=short "${timeout_arg[@]}" "$@"
