# zspeed's two front doors: `make demo` and `make test`. Both set up what they
# need (Debian/Ubuntu packages when run as root or with sudo, a Python venv in
# .venv) and build everything with CMake + Ninja. The demo installs only what
# building and training need; the test toolchains come with `make test`
# (scripts/setup.sh says which package serves what).
#
#   make demo        set up (demo level), build, print the report, run the demo
#   make test        set up (test level), then every test: C (plain,
#                    ASan+UBSan, TSan), Windows cross build under Wine, arm64
#                    cross build under qemu, Python package + pytest
#   make build       the native library, command and C tests in build/
#   make test-c | test-asan | test-tsan | test-windows | test-arm64 | test-python
#   make test-windows-python   the Python suite, the examples and a Linux comparison on
#                    Windows CPython under Wine (docs/WINDOWS.md)
#   make wheel-windows         the win_amd64 wheel, cross-built: build-winpy/dist/

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
VENV ?= .venv
PY := $(VENV)/bin/python
CMAKE_GEN := -G Ninja
# Delete the stamps (or .venv) to re-run the set-up.
SETUP_DEMO := $(VENV)/.zspeed-setup-demo
SETUP_TEST := $(VENV)/.zspeed-setup-test

.PHONY: all setup setup-test build demo test test-c test-asan test-tsan test-windows \
        test-arm64 test-python test-windows-python test-windows-python-quick wheel-windows install-python clean

all: build

$(SETUP_DEMO): scripts/setup.sh requirements.txt
	bash scripts/setup.sh demo $(VENV)
	touch $@

$(SETUP_TEST): scripts/setup.sh requirements.txt requirements-dev.txt
	bash scripts/setup.sh test $(VENV)
	touch $@ $(SETUP_DEMO)

setup: $(SETUP_DEMO)
setup-test: $(SETUP_TEST)

build: setup
	cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j $(JOBS)

test-c: setup-test build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: setup-test
	cmake -S . -B build-asan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug \
	  -DZSPEED_SANITIZE='address;undefined' -DCMAKE_C_COMPILER=clang
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

# TSan needs a fixed address-space layout on kernels with many ASLR bits;
# setarch -R runs ctest (and the tests it starts) without randomization.
test-tsan: setup-test
	cmake -S . -B build-tsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug \
	  -DZSPEED_SANITIZE=thread -DCMAKE_C_COMPILER=clang
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  setarch "$$(uname -m)" -R ctest --output-on-failure -j $(JOBS)

# Cross-build for Windows with MinGW-w64 and run the C tests under Wine.
# Wine's helper processes (wineserver, services) must be started before
# ctest with their output detached, or ctest waits for them forever.
test-windows: setup-test
	cmake -S . -B build-mingw $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake
	cmake --build build-mingw -j $(JOBS)
	bash scripts/wine-ctest.sh build-mingw

# Build the wheel, then install that wheel: the tests check what users get.
install-python: setup
	rm -rf dist
	$(PY) -m pip wheel --no-build-isolation --no-deps -q -w dist .
	$(PY) -m pip install --force-reinstall --no-deps -q dist/zspeed-*.whl

test-python: setup-test install-python
	cd tests/python && ZSPEED_WHEEL="$$(ls $(CURDIR)/dist/zspeed-*.whl)" \
	  ../../$(PY) -m pytest -q -p no:cacheprovider .

# Cross-build for 64-bit Arm and run the C tests under qemu-user: the NEON
# paths get the same tests as the x86 ones.
test-arm64: setup-test
	cmake -S . -B build-arm64 $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
	cmake --build build-arm64 -j $(JOBS)
	cd build-arm64 && ctest --output-on-failure -j $(JOBS) --timeout 900

# zspeed's Python front end on Windows: the official Windows CPython 3.13 (amd64) under
# Wine with Windows wheels of numpy, safetensors, pytest and torch (CPU), and zspeed's own
# win_amd64 wheel installed with the Windows pip; everything lives in build-winpy/ and is
# made anew in a fresh checkout (scripts/wine-python.sh says how, and which Wine 8.0
# work-arounds it needs). Runs the whole Python suite there, the examples' tiny runs, and
# the same training runs on both systems compared (scripts/windows_parity.py). The whole
# suite takes about 72 minutes under Wine on the 2-core VM (docs/WINDOWS.md), so `make test`
# runs test-windows-python-quick: the Windows-specific test files (QUICK in
# scripts/test-windows-python.sh), the examples and the comparison. ZS_WINPY_PYTEST_ARGS
# picks another part.
WINPY_DIR := $(CURDIR)/build-winpy
test-windows-python: setup-test build
	ZS_WINE_DIR=$(WINPY_DIR) bash scripts/test-windows-python.sh

test-windows-python-quick: setup-test build
	ZS_WINE_DIR=$(WINPY_DIR) ZS_WINPY_QUICK=1 bash scripts/test-windows-python.sh

# The wheel a Windows user installs with `pip install` (no compiler needed there).
wheel-windows: setup-test
	ZS_WINE_DIR=$(WINPY_DIR) bash scripts/wine-python.sh --wheel-only

test: test-c test-asan test-tsan test-windows test-arm64 test-windows-python-quick test-python
	@echo "make test: all suites passed"

demo: build install-python
	$(PY) -m zspeed report
	bash scripts/demo.sh

clean:
	rm -rf build build-asan build-tsan build-mingw build-arm64 build-winpy dist
