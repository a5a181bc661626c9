#!/usr/bin/env bash
# transformers' tests/deepspeed/test_deepspeed.py and accelerate's tests/deepspeed/, each run twice on a GPU host
# without network: with zspeed standing in for deepspeed (source tree, ZSPEED_AS_DEEPSPEED=1) and with real
# DeepSpeed 0.19.8. The bundle (GS_BUNDLE, default .gpusuite in the repository root; README.md beside this
# script says what goes in it) holds the test copies and the wheels the host lacks; plugins, stand-in models and
# the summary come from scripts/hf-suite. From the repository root, through the device tool:
#     run(command="bash scripts/hf-suite/gpu/run.sh", carry=[".gpusuite"])
# Writes to $OUT (default ./gpusuite-out): zspeed-transformers.log zspeed-accelerate.log realds-transformers.log
# realds-accelerate.log summary.txt setup.log. Whole script ends within GS_BUDGET seconds (default 525).
#
# Knobs: GS_CPU_SMOKE=1 (CPU-only smoke run: adds the CPU ungate plugins, PY/GS_* point at a local emulation),
# GS_SKIP_PIP=1 + GS_PYPATH_EXTRA (use already-installed packages), GS_BUILD (build dir), GS_SKIP_BUILD=1,
# ZERODIM_FIX=0 (transformers suite without the 0-dim parameter work-around), GS_ONLY="zspeed-transformers ..."
set -uo pipefail
T0=$(date +%s)
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
HS=$REPO/scripts/hf-suite
G=${GS_BUNDLE:-$REPO/.gpusuite}
OUT=${OUT:-$REPO/gpusuite-out}
mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET=${GS_BUDGET:-525}
DEADLINE=$((T0 + BUDGET))
W=${GS_WORK:-/tmp/gpusuite}
SITE=${GS_SITE:-/tmp/site}
DSSITE=${GS_DSSITE:-/tmp/realds-site}
BUILD=${GS_BUILD:-$REPO/build}
CPU=${GS_CPU_SMOKE:-0}
EXTRA=${GS_PYPATH_EXTRA:-}
SETUP=$OUT/setup.log
RUNS=$W/runs.txt
: > "$SETUP"
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$SETUP"; }
left() { echo $((DEADLINE - $(date +%s))); }
# secs CAP RESERVE: time for a step, at most CAP, leaving RESERVE seconds for the steps after it
secs() { local l=$(($(left) - $2)); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }

rm -rf "$W" && mkdir -p "$W" && : > "$RUNS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$W/hf_home
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset ZSPEED_AS_DEEPSPEED RUN_SLOW
# the `accelerate` CLI (accelerate's test_basic_run launches it) next to the interpreter
export PATH=$($PY -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH
BASEPATH=$SITE${EXTRA:+:$EXTRA}

# 1. wheels: test deps into $SITE, real DeepSpeed alone into $DSSITE (so the zspeed runs cannot import it)
if [ "${GS_SKIP_PIP:-0}" != 1 ]; then
  timeout 60 $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$G"/whl/*.whl \
    >>"$SETUP" 2>&1 || log "pip install of .gpusuite/whl failed (rc $?)"
  timeout 30 $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DSSITE" "$G"/dswhl/*.whl \
    >>"$SETUP" 2>&1 || log "pip install of deepspeed failed (rc $?)"
fi
log "wheels done"

# 2. zspeed's C library, built here (zspeed runs from the source tree)
if [ "${GS_SKIP_BUILD:-0}" != 1 ]; then
  { timeout 40 cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZSPEED_WITH_URING=OFF \
      && timeout 120 cmake --build "$BUILD" -j16; } >"$W/build.log" 2>&1 \
    || { log "zspeed build FAILED (rc $?):"; tail -30 "$W/build.log" >>"$SETUP"; }
  tail -2 "$W/build.log" >>"$SETUP"
fi
ZLIB=$BUILD/libzspeed.so
[ -e "$ZLIB" ] && log "zspeed library: $ZLIB" || log "zspeed library MISSING: $ZLIB"

# 3. real DeepSpeed's ops (cpu_adam, fused_adam) JIT-built in the background while the zspeed runs go
export TORCH_EXTENSIONS_DIR=$W/torch_extensions MAX_JOBS=${MAX_JOBS:-12}
if [ "$CPU" != 1 ]; then
  [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] || export TORCH_CUDA_ARCH_LIST=$($PY -c \
    'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null)
  # link against the CUDA toolkit's libcuda stub when no libcuda.so is on the linker's path (as bench/gpu_host.sh)
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
    ch=$($PY -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)
    for s in "$ch/lib64/stubs" "$ch/targets/x86_64-linux/lib/stubs"; do
      [ -n "$ch" ] && [ -e "$s/libcuda.so" ] && export LIBRARY_PATH=${LIBRARY_PATH:+$LIBRARY_PATH:}$s && break
    done
  fi
  OPS="from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder; CPUAdamBuilder().load(); FusedAdamBuilder().load(); print('ops built')"
else
  OPS="from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(); print('ops built')"
fi
(cd "$W" && PYTHONPATH=$DSSITE:$BASEPATH timeout "$(secs 240 220)" $PY -c "$OPS" >"$W/ops.log" 2>&1; echo "rc $?" >>"$W/ops.log") &
OPS_PID=$!

# 4. versions, datasets check, stand-in hub models (tiny random, same architectures)
{
  echo "== host"; nvidia-smi -L 2>&1 | head -2; nproc; command -v nvcc && nvcc --version | tail -1
  PYTHONPATH=$BASEPATH timeout 60 $PY - <<'PYEOF' 2>&1
import sys, importlib
print("python", sys.version.split()[0])
for m in ["torch", "transformers", "accelerate", "huggingface_hub", "datasets", "pydantic", "pyarrow", "parameterized"]:
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, "__version__", "?"), mod.__file__)
    except Exception as e:
        print(m, "IMPORT FAILED:", type(e).__name__, e)
import torch
print("cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PYEOF
} >>"$SETUP"
STUB=""
if ! PYTHONPATH=$BASEPATH timeout 60 $PY -c "import datasets" >/dev/null 2>&1; then
  log "the bundled datasets does not import here: using a stub (tests that need datasets fail or skip)"
  mkdir -p "$W/stub/datasets"
  cat >"$W/stub/datasets/__init__.py" <<'PYEOF'
__version__ = "0.0.0-stub"
def load_dataset(*a, **k):
    raise ImportError("gpusuite stub: the bundled datasets wheel did not import on this host (setup.log)")
class Dataset:
    def __init__(self, *a, **k):
        raise ImportError("gpusuite stub datasets")
PYEOF
  STUB=$W/stub:
fi
cp -r "$G/hf" "$W/hf" && mkdir -p "$W/hf/src"
cp -r "$G/acc" "$W/acc"
cp -r "$HS/plugins" "$W/plugins"
HF_HOME=$W/hf_home PYTHONPATH=$BASEPATH timeout 90 $PY "$HS/make_standins.py" >>"$SETUP" 2>&1 \
  || log "make_standins failed (rc $?)"
log "setup done, $(left)s left"

# 5. the runs: NAME SUITE CAP RESERVE (RESERVE: seconds kept back for the runs after it)
run() {
  local name=$1 suite=$2 cap=$3 reserve=$4 side=${1%%-*}
  if [ -n "${GS_ONLY:-}" ] && [[ " $GS_ONLY " != *" $name "* ]]; then return; fi
  local limit; limit=$(secs "$cap" "$reserve")
  if [ "$limit" -lt 20 ]; then
    echo "$name not run: out of time" >"$OUT/$name.log"; echo "$name not-run (out of time)" >>"$RUNS"; return
  fi
  local plugins=() target=tests/deepspeed pt=${GS_TEST_TIMEOUT:-120}
  if [ "$suite" = hf ]; then
    target=tests/deepspeed/test_deepspeed.py
    plugins=(-p tf_warmup_compat)
    [ "${ZERODIM_FIX:-1}" = 1 ] && plugins+=(-p zerodim_compat)
    [ "$CPU" = 1 ] && plugins+=(-p cpu_ungate -p cpu_bf16)
  else
    [ "$CPU" = 1 ] && plugins+=(-p acc_cpu_ungate)
  fi
  local pp
  if [ "$side" = zspeed ]; then
    pp=$REPO/python:$W/zsite:$W/$suite:$W/plugins:$STUB$BASEPATH
  else
    pp=$DSSITE:$W/$suite:$W/plugins:$STUB$BASEPATH
  fi
  # pytest-timeout >= 2.3: stop after the test running at limit-30 s, so the failure reports still get printed
  local sess=()
  [ -n "$SESSION_TIMEOUT_OK" ] && [ "$limit" -gt 60 ] && sess=(--session-timeout $((limit - 30)))
  log "$name: start (limit ${limit}s, per test ${pt}s${sess:+, session $((limit - 30))s})"
  local t1=$(date +%s)
  (
    cd "$W/$suite" || exit 99
    export PYTHONPATH=$pp
    if [ "$side" = zspeed ]; then
      export ZSPEED_AS_DEEPSPEED=1 ZSPEED_LIBRARY=$ZLIB
    else
      export PATH=$DSSITE/bin:$PATH
    fi
    echo "# $name: PYTHONPATH=$PYTHONPATH ZSPEED_AS_DEEPSPEED=${ZSPEED_AS_DEEPSPEED:-} plugins: ${plugins[*]:-none}"
    $PY -c "import deepspeed, sys; print('# deepspeed is', deepspeed.__file__, getattr(deepspeed, '__version__', '?'))" 2>&1 | tail -1
    exec timeout -k 10 "$limit" $PY -m pytest -p no:cacheprovider "${plugins[@]}" -v -rA --tb=short \
      --show-capture=no --disable-warnings --durations=8 --timeout "$pt" "${sess[@]}" $target
  ) >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall=$(($(date +%s) - t1))s limit=${limit}s" >>"$RUNS"
  log "$name: rc $rc, $(tail -1 "$OUT/$name.log" | cut -c1-150)"
}

SESSION_TIMEOUT_OK=$(PYTHONPATH=$BASEPATH $PY -c "import inspect, pytest_timeout as t; print(1 if 'session_timeout' in inspect.getsource(t) else '')" 2>/dev/null)
mkdir -p "$W/zsite" && cp "$HS/gpu/zsite/sitecustomize.py" "$W/zsite/"
run zspeed-transformers hf 110 280
run zspeed-accelerate acc 70 250
log "waiting for DeepSpeed's op build"
wait $OPS_PID
tail -3 "$W/ops.log" >>"$SETUP"
run realds-transformers hf 280 60
run realds-accelerate acc 70 0

# 6. summary
{
  echo "gpusuite summary ($(date -u +%FT%TZ)), total $(($(date +%s) - T0))s; deepspeed ops build: $(tail -1 "$W/ops.log")"
  echo "transformers plugins: tf_warmup_compat (backport of transformers 5.25's max(1, warmup) fill)$([ "${ZERODIM_FIX:-1}" = 1 ] && echo ', zerodim_compat (a/b shape (1,))'); accelerate: none$([ "$CPU" = 1 ] && echo '; CPU SMOKE RUN (ungated)')"
  PYTHONPATH=$BASEPATH $PY "$HS/gpu/summarize.py" "$OUT" "$RUNS"
} >"$OUT/summary.txt" 2>&1
log "done"
head -12 "$OUT/summary.txt"
