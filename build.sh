#!/usr/bin/env bash
# ubep set-up and checks on a CPU machine.
#   ./build.sh demo [ubep demo options]   install ubep, then run `ubep demo`
#   ./build.sh test [pytest options]      install ubep with its test extras, lint, run every test
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
        exec "$PYTHON" -m pytest -q "$@" ;;
    install) install "[test]" ;;
    *) echo "usage: ./build.sh demo|test|install [options]" >&2; exit 2 ;;
esac
