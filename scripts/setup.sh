#!/usr/bin/env bash
# Installs what building and testing zspeed needs on Debian/Ubuntu (when run
# as root or with sudo), then creates the Python venv given as $1 (.venv).
# On other systems it checks the tools and says what is missing.
set -euo pipefail
VENV=${1:-.venv}

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
need() { # need <package> <test command...>
  local pkg=$1; shift
  if ! "$@" >/dev/null 2>&1; then missing+=("$pkg"); fi
}
need build-essential have gcc
need cmake have cmake
need ninja-build have ninja
need clang have clang
need pkg-config have pkg-config
need liburing-dev test -e /usr/include/liburing.h
need gcc-mingw-w64-x86-64 have x86_64-w64-mingw32-gcc
need wine64 bash -c 'command -v wine64 || test -x /usr/lib/wine/wine64'
need python3-venv python3 -c 'import ensurepip, venv'
need fio have fio
need gcc-aarch64-linux-gnu have aarch64-linux-gnu-gcc
need qemu-user have qemu-aarch64
need util-linux have setarch

if ((${#missing[@]})); then
  if ! have apt-get; then
    echo "setup: missing tools: ${missing[*]}; install them with your package manager" >&2
    exit 1
  fi
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if have sudo; then SUDO="sudo"; else
      echo "setup: need root or sudo to install: ${missing[*]}" >&2
      exit 1
    fi
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# clang's sanitizer runtimes are a separate package on Debian 12.
if have apt-get && ! clang -fsanitize=address -x c - -o /dev/null <<<'int main(void){return 0;}' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -qq libclang-rt-dev >/dev/null 2>&1 || true
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r requirements-dev.txt
echo "setup: ready ($VENV)"
