#!/usr/bin/env bash
# ubep set-up and checks on a CPU machine.
#   ./build.sh demo [ubep demo options]   install ubep, then run `ubep demo`
#   ./build.sh test [pytest options]      install ubep with its test extras, lint, build and test the
#                                         C++ twin (cmake, ctest), run every Python test
#   ./build.sh install                    install ubep with its test extras only
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

# Each long step says what it is about to do: pip is quiet and cmake writes to build.log, so
# without these lines a minute can pass with nothing on the screen.
say() { echo "$*" >&2; }

install() {
    # Pin the CPU wheel when torch is missing: an unpinned torch resolves to a multi-GB CUDA build.
    if ! "$PYTHON" -c "import torch" 2>/dev/null; then
        say "installing torch 2.13.0 (pip, the CPU wheel, a few minutes)..."
        "$PYTHON" -m pip install --quiet "torch==2.13.0"
    fi
    say "installing ubep$1 (pip, about a minute)..."
    "$PYTHON" -m pip install --quiet -e ".$1"
}

command=${1:-test}
shift || true
case "$command" in
    demo) install ""; exec "$PYTHON" -m ubep.cli demo "$@" ;;
    test)
        install "[test]"
        say "linting (ruff)..."
        "$PYTHON" -m ruff check ubep tests benchmarks
        say "building the C++ twins and the Ascend C kernels (cmake, a few minutes; log in build.log)..."
        cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
        cmake --build build -j 2 >> build.log 2>&1 || { cat build.log; exit 1; }
        say "testing the C++ twins (ctest)..."
        (cd build && ctest --output-on-failure)
        # One line per test file, its tests counted as they pass, and why each skip was skipped.
        say "running the tests (pytest, several minutes)..."
        exec "$PYTHON" -m pytest -o console_output_style=count -rs "$@" ;;
    install) install "[test]" ;;
    *) echo "usage: ./build.sh demo|test|install [options]" >&2; exit 2 ;;
esac
