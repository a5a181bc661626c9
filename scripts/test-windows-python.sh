#!/usr/bin/env bash
# make test-windows-python: zspeed's Python front end on Windows CPython 3.13 (amd64) under
# Wine, with torch's win_amd64 CPU wheel and zspeed's own win_amd64 wheel installed by the
# Windows pip (scripts/wine-python.sh sets that up, once per checkout, in build-winpy/):
#
#   1. the whole Python suite (tests/python) under Windows CPython, less the cases named in
#      DESELECT below, each with its reason
#   2. the examples' tiny runs (tiny_mlp, opt_finetune, demo_train, data_parallel through
#      `zspeed launch` on 2 Gloo ranks)
#   3. the same training runs on Linux and on Windows, compared (scripts/windows_parity.py:
#      ZeRO-2 CPU offload, NVMe offload over IOCP, ZeRO-3 with offload, save/load/resume,
#      `zspeed to-fp32`, `zspeed report`, 2 ranks through `zspeed launch`)
#
# Prints how long each part took. Needs the Linux build (build/, `make build`) for the Linux
# side of 3. Environment: ZS_WINE_DIR as for wine-python.sh; ZS_WINPY_PYTEST_ARGS replaces
# the pytest selection (e.g. "tests/python/test_comm.py -x") for a quicker look;
# ZS_WINPY_QUICK=1 (what `make test` runs, within CI's time) takes QUICK below instead of the
# whole suite: the test files of what differs on Windows (the library's load, IOCP aio and
# swap files, the memory query, file locks, replace and sharing rules of checkpoints, the
# one-process store, the launcher), with 2 and 3 unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export ZS_WINE_DIR=${ZS_WINE_DIR:-$PWD/build-winpy}
W=(bash scripts/wine-python.sh)
LINUX_PY=${LINUX_PY:-.venv/bin/python}
t0=$(date +%s)
times=()
lap() { local now; now=$(date +%s); times+=("$1: $(( now - t_lap ))s"); t_lap=$now; }
t_lap=$t0

# Cases that cannot pass under Wine 8.0, by name, with the reason (docs/WINDOWS.md has the
# evidence). Everything else in tests/python runs.
DESELECT=(
)

# Set-up: packages, Windows CPython, Windows wheels, zspeed's wheel (cross-built, installed).
"${W[@]}" --setup-only
lap "set-up (Windows CPython, wheels, zspeed's win_amd64 wheel)"

# Wine's server started once for every step below (each wine call would otherwise start and
# stop its own), with its output detached so that no pipe waits for it; stopped at the end.
export WINEPREFIX=$ZS_WINE_DIR/prefix PATH="/usr/lib/wine:$PATH"
wineserver=$(command -v wineserver64 || command -v wineserver)
"$wineserver" -p </dev/null >/dev/null 2>&1 &
trap '"$wineserver" -k >/dev/null 2>&1 || true' EXIT
export ZS_WINE_REBUILD=never   # the wheel was just built and installed: once per run

# The Windows-specific part of the suite (ZS_WINPY_QUICK=1): about 6 minutes under Wine on
# the 2-core VM, where the whole suite takes about 72.
QUICK=(test_native.py test_accelerator.py test_aio.py test_swap.py test_swap_files.py test_swap_arrays.py
       test_comm_one_process.py test_engine_nvme.py test_nvme_sweep.py test_checkpoint.py test_untrusted_files.py
       test_launch.py)

# 1. The Python suite.
deselect=()
for d in "${DESELECT[@]}"; do deselect+=(--deselect "${d%% *}"); done
if [ -n "${ZS_WINPY_PYTEST_ARGS:-}" ]; then
  read -r -a sel <<<"$ZS_WINPY_PYTEST_ARGS"
  what="pytest $ZS_WINPY_PYTEST_ARGS"
elif [ "${ZS_WINPY_QUICK:-0}" = 1 ]; then
  sel=("${QUICK[@]/#/tests/python/}" "${deselect[@]}")
  what="pytest: the Windows-specific files (${#QUICK[@]})"
else
  sel=(tests/python "${deselect[@]}")
  what="pytest tests/python"
fi
"${W[@]}" -m pytest -q -p no:cacheprovider -rfE "${sel[@]}"
lap "$what under Windows CPython"

# 2. The examples' tiny runs (what a Windows user would try first).
ex=$ZS_WINE_DIR/examples
rm -rf "$ex"; mkdir -p "$ex"
export ZSPEED_DEVICE=cpu
"${W[@]}" examples/tiny_mlp.py | tail -n 2
"${W[@]}" examples/opt_finetune.py --steps 2 --seq-len 32 | tail -n 2
"${W[@]}" examples/demo_train.py --steps 30 --out "$ex/demo" --sample-chars 40 | tail -n 4
"${W[@]}" -m zspeed to-fp32 "$ex/demo/checkpoints" "$ex/demo/model_fp32.safetensors" | tail -n 1
"${W[@]}" -m zspeed launch --num_gpus 2 examples/data_parallel.py --epochs 1 \
  --deepspeed_config examples/zero2_offload.json | tail -n 2
lap "examples (tiny_mlp, opt_finetune, demo_train + to-fp32, data_parallel on 2 ranks)"

# 3. The same runs on Linux and on Windows, compared.
par=$ZS_WINE_DIR/parity
rm -rf "$par"; mkdir -p "$par"
PYTHONPATH=python "$LINUX_PY" scripts/windows_parity.py run "$par/linux"
"${W[@]}" scripts/windows_parity.py run "$par/windows"
"$LINUX_PY" scripts/windows_parity.py compare "$par/linux" "$par/windows"
lap "Linux/Windows comparison (scripts/windows_parity.py)"

echo "test-windows-python: times:"
printf '  %s\n' "${times[@]}"
echo "test-windows-python: total $(( $(date +%s) - t0 ))s"
