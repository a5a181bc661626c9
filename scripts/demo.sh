#!/usr/bin/env bash
# The body of `make demo` (after set-up, build and the report).
set -euo pipefail
cd "$(dirname "$0")/.."
echo
echo "== optimizer benchmark (2^22 params; bench/bench_adam.py for full runs) =="
build/zspeed bench adam --n 4194304 --steps 5
echo
echo "== I/O benchmark (256 MiB file in ${TMPDIR:-/tmp}; bench/bench_io.py compares with fio) =="
build/zspeed bench io --folder "${TMPDIR:-/tmp}" --size 256M --loops 3
rm -f "${TMPDIR:-/tmp}/zspeed_bench_io.bin"
