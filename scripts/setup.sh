#!/usr/bin/env bash
# Installs what zspeed needs on Debian/Ubuntu (when run as root or with sudo)
# and creates the Python venv. Two levels, so that seeing zspeed train does not
# wait for the test toolchains:
#
#   scripts/setup.sh demo [VENV]   build + train: a C compiler, CMake, Ninja,
#                                  liburing headers, python3-venv; a venv with
#                                  requirements.txt (numpy, torch, safetensors,
#                                  tqdm, scikit-build-core)
#   scripts/setup.sh test [VENV]   everything `make test` runs, on top of demo:
#                                  clang and its sanitizer runtimes, MinGW-w64
#                                  and Wine, the aarch64 cross compiler with its
#                                  C library and qemu-user; pytest in the venv
#
# Every package a suite needs is named here: nothing relies on apt's
# "Recommends" (packages are installed with --no-install-recommends, as in
# minimal images). On other systems it checks the tools and says what is
# missing.
set -euo pipefail
LEVEL=${1:-test}
VENV=${2:-.venv}
case "$LEVEL" in demo|test) ;; *) echo "usage: setup.sh demo|test [VENV]" >&2; exit 2;; esac
cd "$(dirname "$0")/.."

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
need() { # need <package> <test command...>
  local pkg=$1; shift
  if ! "$@" >/dev/null 2>&1; then missing+=("$pkg"); fi
}
# Build and demo: the library, the native command and the wheel.
need build-essential have gcc                   # gcc, make, libc headers
need cmake have cmake
need ninja-build have ninja
need liburing-dev test -e /usr/include/liburing.h   # the io_uring backend
need python3-venv python3 -c 'import ensurepip, venv'
if [ "$LEVEL" = test ]; then
  need clang have clang                         # the ASan+UBSan and TSan builds
  need util-linux have setarch                  # TSan runs under setarch -R
  need gcc-mingw-w64-x86-64 have x86_64-w64-mingw32-gcc   # the Windows build
  need wine64 bash -c 'command -v wine64 || test -x /usr/lib/wine/wine64'
  need gcc-aarch64-linux-gnu have aarch64-linux-gnu-gcc   # the arm64 build ...
  need libc6-dev-arm64-cross test -e /usr/aarch64-linux-gnu/lib/crt1.o  # ... and its C runtime
  need qemu-user have qemu-aarch64              # runs the arm64 tests
fi

install_missing() {
  ((${#missing[@]})) || return 0
  if ! have apt-get; then
    echo "setup: missing: ${missing[*]}; install them with your package manager" >&2
    exit 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if have sudo; then sudo="sudo"; else
      echo "setup: need root or sudo to install: ${missing[*]}" >&2
      exit 1
    fi
  fi
  echo "setup ($LEVEL): installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  missing=()
}
install_missing
if [ "$LEVEL" = test ]; then
  # Debian 12 ships clang's sanitizer runtimes apart from clang (libclang-rt-dev);
  # elsewhere they come with clang, so this is asked only once clang is there.
  need libclang-rt-dev bash -c "clang -fsanitize=address,undefined -x c - -o /dev/null <<<'int main(void){return 0;}'"
  install_missing
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
req=requirements.txt
[ "$LEVEL" = test ] && req=requirements-dev.txt
"$VENV/bin/python" -m pip install -q -r "$req"
echo "setup ($LEVEL): ready ($VENV)"
