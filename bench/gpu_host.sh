#!/usr/bin/env bash
# Runs zspeed's tests and benchmarks on the H200 GPU host (16-core Xeon with
# AVX-512, no network). The rows of bench/RESULTS.md marked "GPU host" come
# from this script. Usage:
#   bench/gpu_host.sh setup     build (with liburing if its .debs are given)
#   bench/gpu_host.sh tests     C tests (every ISA/backend variant) + pytest
#   bench/gpu_host.sh adam      bench/bench_adam.py at 2^28, 16 threads
#   bench/gpu_host.sh gpu-checks  the GPU gate: tests/python's engine files on cuda:0 and every
#                   tests/gpu check, one summary line (tests/gpu/gate.py; ZS_GATE_ARGS=--all: whole suite)
#   bench/gpu_host.sh engine    GPU correctness check of the offload path
#   bench/gpu_host.sh examples  the two DeepSpeed-guide example scripts
#   bench/gpu_host.sh engine-bench  1.3B GPT: zspeed vs DeepSpeed vs GPU-only
#   bench/gpu_host.sh zero3     GPU check of ZeRO-3 (tests/gpu/check_zero3_cuda.py)
#   bench/gpu_host.sh budget-bench  1.28B GPT, ZeRO-2 + CPU offload, GPU capped at ZS_CAP (24) GiB:
#                   ratio "auto" + overlap_forward, ratio 1, DeepSpeed (ZS_BUDGET_IMPLS picks the rows)
#   bench/gpu_host.sh split3-bench  ZeRO-3 both offloads, GPU capped at 24 GiB, batch 8: 3.36B ratio 1 /
#                   overlap_forward / "auto" + overlap_forward / DeepSpeed, 6.58B int8: auto, a ratio
#                   (ZS_BIG_RATIO) with the rest in host memory, on NVMe, or on three tiers (ZS_MAX_IN_CPU
#                   in host memory) (ZS_SPLIT3_ROWS picks; ZS_SPLIT3_BUSY=1 adds the GPU's busy share)
#   bench/gpu_host.sh plan-check  zspeed plan's predicted steps vs steps measured in the same run, same card (ZS_PLAN_CASES)
#   bench/gpu_host.sh hf        the Hugging Face Trainer route on the GPU (tests/gpu/check_hf_cuda.py)
#   bench/gpu_host.sh zero3-bench  ZeRO-3 + param/optimizer offload, GPU capped at 24 GiB:
#                   zspeed vs DeepSpeed at 3.36B (ZS_Z3_LAYERS: more zspeed sizes, e.g. "24 48")
#   bench/gpu_host.sh scaling   bench_engine.py under torchrun on ZS_NGPU GPUs (default: all), ZS_SCALE_CASE
#                   z2-3.7b (ZeRO-2 + CPU offload, 3.7B) or z3-13b (ZeRO-3, both offloads, 13B),
#                   ZS_SCALE_IMPLS (default "zspeed deepspeed"); bench/scaling_table.py $OUT
#                   turns the logs of every GPU count into the table with scaling efficiency
#   bench/gpu_host.sh inference-bench  13B ZeRO-Inference, weights in host memory: zspeed vs DeepSpeed
#                   (bench/bench_inference.py; ZS_INF_ARGS: more flags, e.g. --offload-param nvme)
#   bench/gpu_host.sh split-bench  1.28B GPT, ZeRO-2 + CPU offload: exact, ratio, overlap_forward, delayed, DeepSpeed, ZenFlow
#                   (medians and means of 10 steps; Chrome traces under $OUT/traces)
#   bench/gpu_host.sh stream-bench  bench/bench_stream_step.py: the CPU's AdamW share, the same step streamed
#                   through the GPU from page-locked memory, and both at once (host-memory contention)
#   bench/gpu_host.sh io        bench/bench_io.py + bench/bench_swap.py
#   bench/gpu_host.sh nvme-bench  engine step, offload_optimizer nvme vs cpu, 2^28 params
#   bench/gpu_host.sh ds-nvme   zspeed vs DeepSpeed ZeRO-3, optimizer state on NVMe
#                   (bench/bench_ds_nvme.py; ZS_DSNVME_PARAMS, default 2^28; ZS_DSNVME_ARGS: more flags)
# Optional: ZS_HOST_DEBS=dir (or dir:dir...) with .debs to unpack under
# /tmp/zs-host: liburing2/liburing-dev (the host has no liburing) and, for
# ds-nvme, libaio1/libaio-dev (the host has no libaio, which DeepSpeed's
# async_io op needs: CPATH/LIBRARY_PATH/LD_LIBRARY_PATH then point into the
# prefix, so its is_compatible() test and its JIT build find libaio.h and
# -laio), ZS_HOST_WHEELS=dir with deepspeed and its missing deps,
# ZS_HOST_FIO=a .tar.xz holding .fio/fio (a wrapper) + .fio/lib (the host has
# no fio; Debian 12's fio with its shared libraries was used).
# Logs go to $OUT (or ./host-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/host-out}
mkdir -p "$OUT"
PREFIX=/tmp/zs-host
if [ -n "${ZS_HOST_DEBS:-}" ]; then
  mkdir -p $PREFIX/.debs
  IFS=: read -ra _dirs <<<"$ZS_HOST_DEBS"
  for dir in "${_dirs[@]}"; do
    for d in "$dir"/*.deb; do  # each .deb once per machine (a later call may add more)
      [ -e "$d" ] && [ ! -e "$PREFIX/.debs/$(basename "$d")" ] && dpkg -x "$d" $PREFIX \
        && touch "$PREFIX/.debs/$(basename "$d")"
    done
  done
fi
if [ -n "${ZS_HOST_WHEELS:-}" ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$ZS_HOST_WHEELS"/*.whl
fi
if [ -n "${ZS_HOST_FIO:-}" ] && [ ! -x /tmp/zs-fio/.fio/fio ]; then
  mkdir -p /tmp/zs-fio && tar -xJf "$ZS_HOST_FIO" -C /tmp/zs-fio
fi
[ -x /tmp/zs-fio/.fio/fio ] && export PATH=/tmp/zs-fio/.fio:$PATH
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -e $PREFIX/usr/include/libaio.h ]; then
  # gcc/c++ read these: DeepSpeed's has_function('io_submit', ['aio']) test and
  # its torch JIT build of async_io (-laio) then find the unpacked libaio.
  export CPATH=$PREFIX/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
fi
export PYTHONPATH=$PWD/python:${PYTHONPATH:-}
export ZSPEED_LIBRARY=$PWD/build/libzspeed.so
export PYTHONUNBUFFERED=1
# torch's OpenMP workers spin after each torch op and steal cores from
# zspeed's pool (bench/RESULTS.md, "Note: torch's OpenMP threads").
export OMP_WAIT_POLICY=PASSIVE

case "${1:-}" in
setup)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH=$PREFIX/usr 2>&1 | tail -2
  cmake --build build -j 16 2>&1 | grep -E "error|warning" ; build/zspeed report
  ;;
tests)
  (cd build && ctest -j 8 --output-on-failure) 2>&1 | tee "$OUT/ctest.log" | tail -40
  python3 -m pytest -q -p no:cacheprovider tests/python 2>&1 | tee "$OUT/pytest.log" | tail -15
  ;;
stream-bench)
  python3 bench/bench_stream_step.py --threads 16 --n ${ZS_STREAM_N:-268435456} --steps 7 2>&1 | tee "$OUT/bench_stream_step.log"
  ;;
adam)
  python3 bench/bench_adam.py --threads 16 --n 268435456 --steps 10 2>&1 | tee "$OUT/bench_adam.log"
  ;;
gpu-checks)
  # The GPU gate (tests/gpu/gate.py): the engine files of the Python suite on cuda:0 and every
  # tests/gpu check; ends with "gpu-checks: N passed, M failed". ZS_GATE_ARGS: e.g. --all.
  python3 tests/gpu/gate.py --log-dir "$OUT" ${ZS_GATE_ARGS:-} 2>&1 | tee "$OUT/gpu-checks.log"
  ;;
engine)
  python3 tests/gpu/check_engine_cuda.py 2>&1 | tee "$OUT/check_engine_cuda.log" | tail -20
  ;;
examples)
  python3 examples/tiny_mlp.py 2>&1 | tee "$OUT/tiny_mlp.log" | tail -8
  python3 examples/opt_finetune.py --steps 20 2>&1 | tee "$OUT/opt_finetune.log" | tail -8
  ;;
engine-bench)
  # DeepSpeed outside its launcher: a one-process "distributed" setup.
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512
  for impl in zspeed deepspeed torch; do
    python3 bench/bench_engine.py --impl $impl 2>&1 | tee "$OUT/bench_engine_$impl.log" | tail -6
  done
  ;;
budget-bench)
  # 1.28B GPT, ZeRO-2 + CPU offload with the GPU capped at ZS_CAP GiB (default 24): ratio
  # "auto" + overlap_forward (sized from step 1's peak), ratio 1, and DeepSpeed, side by side;
  # ZS_BUDGET_IMPLS (default "auto one deepspeed") picks the rows.
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29513
  cap=${ZS_CAP:-24}
  for row in ${ZS_BUDGET_IMPLS:-auto one deepspeed}; do
    case $row in
      auto) args="--ratio auto --overlap-forward" ;;
      one) args="--ratio 1" ;;
      deepspeed) args="--impl deepspeed" ;;
      *) echo "unknown row $row"; continue ;;
    esac
    python3 bench/bench_engine.py --gpu-cap "$cap" $args 2>&1 | tee "$OUT/budget_$row.log" \
      | grep -E "ratio|RESULT|median|Error|error" | tail -4
  done
  ;;
split3-bench)
  # ZeRO-3 with both offloads, GPU capped at 24 GiB, micro-batch 8 x 1024, activation
  # checkpointing (issue 30's cases): 3.36B fp32 states and 6.58B int8 states; rows from
  # ZS_SPLIT3_ROWS (default "one over auto deepspeed big-auto"): ratio 1, ratio 1 + overlap_forward,
  # ratio "auto" + overlap_forward, DeepSpeed, 6.58B int8 "auto" + overlap_forward; ZS_SPLIT3_STEPS
  # timed steps per row (default 5).
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29515
  Z3="--stage 3 --offload-param cpu --gpu-cap 24 --ckpt --d-model 4096 --heads 32 --batch 8 --steps ${ZS_SPLIT3_STEPS:-5} --warmup 2"
  for row in ${ZS_SPLIT3_ROWS:-one over auto deepspeed big-auto}; do
    case $row in
      one) args="--layers 16 --ratio 1" ;;
      over) args="--layers 16 --ratio 1 --overlap-forward" ;;
      auto) args="--layers 16 --ratio auto --overlap-forward" ;;
      deepspeed) args="--layers 16 --impl deepspeed" ;;
      big-one) args="--layers 32 --state-dtype int8 --ratio 1" ;;
      big-auto) args="--layers 32 --state-dtype int8 --ratio auto --overlap-forward" ;;
      big-split) args="--layers 32 --state-dtype int8 --ratio ${ZS_BIG_RATIO:-0.83}" ;;
      big-nvme) args="--layers 32 --state-dtype int8 --offload nvme --ratio ${ZS_BIG_RATIO:-0.83}" ;;
      big-tiers) args="--layers 32 --state-dtype int8 --offload nvme --ratio ${ZS_BIG_RATIO:-0.83} --max-in-cpu ${ZS_MAX_IN_CPU:-2.7e9}" ;;
      *) echo "unknown row $row"; continue ;;
    esac
    [ -n "${ZS_SPLIT3_BUSY:-}" ] && args="$args --gpu-busy"
    python3 bench/bench_engine.py $Z3 $args 2>&1 | tee "$OUT/split3_$row.log" \
      | grep -E "ratio \"auto\" ->|GPU busy|RESULT|Error|error" | tail -4
  done
  ;;
plan-check)
  python3 bench/plan_check.py 2>&1 | tee "$OUT/plan_check.log"
  ;;
hf)
  python3 tests/gpu/check_hf_cuda.py 2>&1 | tee "$OUT/check_hf_cuda.log" | tail -12
  ;;
zero3)
  python3 tests/gpu/check_zero3_cuda.py 2>&1 | tee "$OUT/check_zero3_cuda.log" | tail -12
  ;;
zero3-bench)
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29514
  Z3="--stage 3 --offload-param cpu --gpu-cap 24 --ckpt --d-model 4096 --heads 32 --batch 1 --steps 5 --warmup 2"
  for impl in zspeed deepspeed; do
    python3 bench/bench_engine.py $Z3 --layers 16 --impl $impl 2>&1 | tee "$OUT/bench_z3_16_$impl.log" | tail -2
  done
  for L in ${ZS_Z3_LAYERS:-}; do
    python3 bench/bench_engine.py $Z3 --layers $L --state-dtype int8 2>&1 | tee "$OUT/bench_z3_${L}_int8.log" | tail -2
  done
  ;;
scaling)
  n=${ZS_NGPU:-$(nvidia-smi -L | wc -l)}
  case ${ZS_SCALE_CASE:-z2-3.7b} in
    z2-3.7b) args="--layers 32 --d-model 3072 --heads 24 --batch 8 --steps 6 --warmup 2" ;;
    z3-13b) args="--stage 3 --offload-param cpu --ckpt --layers 40 --d-model 5120 --heads 40 --batch 1 --steps 4 --warmup 1 --state-dtype int8" ;;
    *) echo "unknown ZS_SCALE_CASE ${ZS_SCALE_CASE}"; exit 2 ;;
  esac
  for impl in ${ZS_SCALE_IMPLS:-zspeed deepspeed}; do
    extra=""
    [ "$impl" = deepspeed ] && extra="--state-dtype fp32"  # DeepSpeed's CPU Adam keeps fp32 states
    OMP_NUM_THREADS=$(( $(nproc) / n )) torchrun --nproc_per_node "$n" --master_port $((29600 + n)) \
      bench/bench_engine.py $args $extra --impl "$impl" 2>&1 \
      | tee "$OUT/scaling_${ZS_SCALE_CASE:-z2-3.7b}_${impl}_${n}gpu.log" | grep -E "median step|RESULT" | cut -c1-400
  done
  ;;
inference-bench)
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29515
  for impl in zspeed deepspeed; do
    python3 bench/bench_inference.py --impl $impl --gpu-cap 24 --new-tokens 32 --runs 1 ${ZS_INF_ARGS:-} 2>&1 \
      | tee "$OUT/bench_inference_$impl.log" | tail -2
  done
  ;;
split-bench)
  # Issue 16's modes side by side; DeepSpeed and ZenFlow need the DeepSpeed wheel (see ds-*).
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29516
  mkdir -p "$OUT/traces"
  for mode in "exact:--trace $OUT/traces/exact.json" "int8:--state-dtype int8" "r0.3:--ratio 0.3" "auto:--ratio auto" \
              "overlap:--overlap-forward --trace $OUT/traces/overlap.json" "r0.3_overlap:--ratio 0.3 --overlap-forward" \
              "auto_overlap:--ratio auto --overlap-forward --trace $OUT/traces/auto_overlap.json" \
              "auto_overlap_int8:--ratio auto --overlap-forward --state-dtype int8" \
              "overlap_noclip:--overlap-forward --clip 0" "delayed:--delayed-update" "torch:--impl torch" \
              "deepspeed:--impl deepspeed" "zenflow:--impl deepspeed --zenflow"; do
    python3 bench/bench_engine.py --steps 10 --warmup 3 ${mode#*:} 2>&1 \
      | tee "$OUT/bench_split_${mode%%:*}.log" | grep -E "median step|auto"
  done
  ;;
io)
  mkdir -p /tmp/zs-io /tmp/zs-swap; df -h /tmp/zs-io | tail -1
  python3 bench/bench_io.py --folder /tmp/zs-io --size 4G --loops 5 2>&1 | tee "$OUT/bench_io.log" | tail -12
  python3 bench/bench_swap.py --params 2^28 --folder /tmp/zs-swap --steps 5 2>&1 | tee "$OUT/bench_swap.log" | tail -12
  python3 bench/bench_swap.py --params 2^28 --folder /tmp/zs-swap --steps 5 --state q8 2>&1 | tee "$OUT/bench_swap_q8.log" | tail -12
  ;;
nvme-bench)
  mkdir -p /tmp/zs-nvme
  python3 bench/bench_engine_nvme.py --params 2^28 --folder /tmp/zs-nvme --steps 3 2>&1 | tee "$OUT/bench_engine_nvme.log" | tail -4
  python3 bench/bench_engine_nvme.py --params 2^28 --folder /tmp/zs-nvme --steps 3 --state int8 2>&1 | tee -a "$OUT/bench_engine_nvme.log" | tail -1
  ;;
ds-nvme)
  # DeepSpeed outside its launcher (one-process "distributed" setup); its
  # async_io op is JIT-built on first use (~1 min) and links -lcuda: when no
  # libcuda.so is on the linker's path, the CUDA toolkit's stub is used for
  # linking (at run time the driver's libcuda.so.1 is loaded).
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29513
  if ! echo 'int main(void){return 0;}' | cc -x c - -lcuda -o /dev/null 2>/dev/null; then
    ch=$(python3 -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)
    for s in "$ch/lib64/stubs" "$ch/targets/x86_64-linux/lib/stubs"; do
      [ -n "$ch" ] && [ -e "$s/libcuda.so" ] && export LIBRARY_PATH=${LIBRARY_PATH:+$LIBRARY_PATH:}$s && break
    done
  fi
  # torch names the H200's architecture "9.0a", which DeepSpeed 0.19.8's
  # compute_capability_args cannot parse (ValueError: '0a'); give it the
  # plain major.minor.
  [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] || export TORCH_CUDA_ARCH_LIST=$(python3 -c \
    'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null)
  [ -e $PREFIX/usr/include/libaio.h ] || echo "ds-nvme: no libaio in $PREFIX (ZS_HOST_DEBS): DeepSpeed will be skipped"
  mkdir -p /tmp/zs-dsnvme; df -h /tmp/zs-dsnvme | tail -1; free -g | head -2
  python3 bench/bench_ds_nvme.py --params "${ZS_DSNVME_PARAMS:-2^28}" --folder /tmp/zs-dsnvme --steps 5 ${ZS_DSNVME_ARGS:-} \
    2>&1 | tee "$OUT/bench_ds_nvme.log" | grep --line-buffered -v -E '\[(INFO|WARNING)\]'
  rm -rf /tmp/zs-dsnvme
  ;;
*)
  sed -n 2,23p "$0"; exit 2 ;;
esac
