#!/usr/bin/env bash
# ubep set-up and checks on a CPU machine, and the Ascend build where CANN is installed.
#   ./build.sh demo [ubep demo options]   install ubep, then run `ubep demo`
#   ./build.sh test [pytest options]      install ubep with its test extras, lint, build and test the
#                                         C++ twin (cmake, ctest), run every Python test
#   ./build.sh install                    install ubep with its test extras only
#   ./build.sh npu [cmake options]        with CANN: the operator package and, where torch_npu is
#                                         installed, its torch binding, in build-npu/ (docs/ASCEND.md)
#   ./build.sh cpudebug [cmake options]   with CANN: compile the kernels in CANN's CPU-debug mode, in
#                                         build-cpudebug/
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

# The CANN builds need a toolkit whose set_env.sh was sourced: one line saying so, nothing else.
need_cann() {
    if [[ -z "${ASCEND_HOME_PATH:-}" || ! -d "$ASCEND_HOME_PATH/compiler/tikcpp/ascendc_kernel_cmake" ]]; then
        echo "./build.sh $1: no CANN toolkit (ASCEND_HOME_PATH='${ASCEND_HOME_PATH:-}' has no compiler/tikcpp/ascendc_kernel_cmake); source <cann>/set_env.sh first" >&2
        exit 1
    fi
}

# cmake in $1 with the remaining options, log in $1.log.
cann_build() {
    local dir=$1
    shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
    cmake --build "$dir" -j "$(nproc)" >> "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
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
    npu)
        need_cann npu
        say "building the Ascend operator package and its torch binding (cmake, log in build-npu.log)..."
        cann_build build-npu -DUBEP_REQUIRE_CANN=ON -DUBEP_SOC_VERSION="${UBEP_SOC_VERSION:-ascend910_93}" "$@"
        say "package: $(ls build-npu/ascend_ops/package/*.run 2>/dev/null || echo 'none, see build-npu.log')"
        if [[ -f build-npu/ascend_ops/libubep_ascend.so ]]; then
            say "binding: UBEP_ASCEND_LIB=$PWD/build-npu/ascend_ops/libubep_ascend.so"
        else
            say "binding: not built (torch or torch_npu missing, see build-npu.log)"
        fi ;;
    cpudebug)
        need_cann cpudebug
        say "compiling the kernels in CANN's CPU-debug mode (cmake, log in build-cpudebug.log)..."
        cann_build build-cpudebug -DUBEP_ASC_CPU_DEBUG=ON "$@"
        say "the kernels compile against $ASCEND_HOME_PATH in CPU-debug mode" ;;
    *) echo "usage: ./build.sh demo|test|install|npu|cpudebug [options]" >&2; exit 2 ;;
esac
