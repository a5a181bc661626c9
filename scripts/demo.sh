#!/usr/bin/env bash
# The body of `make demo` (after set-up, build and the report).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
echo
echo "== native benchmarks (quick settings; see bench/ for full runs) =="
if build/zspeed bench --help >/dev/null 2>&1; then
  build/zspeed bench adam --quick
  build/zspeed bench io --quick --dir "${TMPDIR:-/tmp}"
else
  echo "(no native benchmarks in this build)"
fi
