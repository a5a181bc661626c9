#!/usr/bin/env bash
# Runs ctest in a MinGW build tree under Wine: a private prefix, Wine's helper
# processes started first with their output detached (ctest would otherwise
# wait for them), and stopped afterwards.
set -euo pipefail
build=${1:?usage: wine-ctest.sh BUILD_DIR}
export WINEPREFIX="$(cd "$build" && pwd)/wineprefix"
export WINEDEBUG=-all
export PATH="/usr/lib/wine:$PATH"
wine=$(command -v wine64 || command -v wine)
wineserver=$(command -v wineserver64 || command -v wineserver)
"$wineserver" -p </dev/null >/dev/null 2>&1 &
"$wine" cmd /c exit </dev/null >/dev/null 2>&1 || true
trap '"$wineserver" -k >/dev/null 2>&1 || true' EXIT
cd "$build"
ctest --output-on-failure -j 2 --timeout 600
