#!/usr/bin/env bash
# ubep set-up and checks on a CPU machine.
#   ./build.sh demo [ubep demo options]   install ubep, then run `ubep demo`
#   ./build.sh test [pytest options]      install ubep with its test extras, lint, build and test the
#                                         C++ twin (cmake, ctest), run every Python test
#   ./build.sh install                    install ubep with its test extras only
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

install() {
    # Pin the CPU wheel when torch is missing: an unpinned torch resolves to a multi-GB CUDA build.
    if ! "$PYTHON" -c "import torch" 2>/dev/null; then
        "$PYTHON" -m pip install --quiet "torch==2.13.0"
    fi
    "$PYTHON" -m pip install --quiet -e ".$1"
}

command=${1:-test}
shift || true
case "$command" in
    demo) install ""; exec "$PYTHON" -m ubep.cli demo "$@" ;;
    test)
        install "[test]"
        "$PYTHON" -m ruff check ubep tests benchmarks
        cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
        cmake --build build -j 2 >> build.log 2>&1 || { cat build.log; exit 1; }
        (cd build && ctest --output-on-failure)
        exec "$PYTHON" -m pytest -q "$@" ;;
    install) install "[test]" ;;
    *) echo "usage: ./build.sh demo|test|install [options]" >&2; exit 2 ;;
esac
