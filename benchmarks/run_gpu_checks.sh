#!/usr/bin/env bash
# Everything this project checks on a GPU machine: the GPU tests (bit for bit against the oracle,
# stress, timeouts, CUDA graphs, wire images, profiling), then the side-by-side benchmark.
#   benchmarks/run_gpu_checks.sh [part ...]
#   parts: exact, lifetime, worlds, stress, bench, sweep, plain (default: all)
# exact: wire images, launches, and tests/test_cuda.py at W = 1 and 2 but the stress test; lifetime:
# tests/test_cuda_lifetime.py (40 Buffers of five model shapes made, used and destroyed in one
# process, two alive at once, a CUDA graph that outlives its Buffer); worlds:
# the oracle matrix at W = 4 and 8; stress: the 2000-call stress tests; bench: bench_ep.py, then
# its targets read off the results (benchmarks/targets.py, into $OUT/targets.md); sweep:
# bench_ep.py over other model shapes (SWEEP_SHAPES, HIDDEN:EXPERTS:TOP_K each) at 128 and 4096
# tokens, uniform routing, the reference and the cuda backend in `sw` and `tff`; plain:
# benchmarks/one_gpu.py (each call beside plain kernels moving the same rows, ONE_GPU_ARGS).
# Each group runs under its own time limit (LIMIT_S, default 420 s), so one stuck group cannot use up
# the others' time; a GPU test case costs 10-120 s (processes, NCCL, Triton compiles; the low end with
# a warm Triton cache, TRITON_CACHE_DIR). Where pytest-xdist is installed the tests run in 3 workers
# (PYTEST_WORKERS). On one H200 with the ranks sharing it (8 workers, a fresh machine) `exact` takes
# about 5 minutes, `stress` 3, `worlds` more than 9 (on a machine lent for 10-minute calls: one part
# per call; the whole benchmark needs LIMIT_S=590). `dc`'s stress at 7168 elements takes about 0.23 s
# a call on one shared GPU, 8 minutes per layout: there, run one layout per call,
# `python3 -m pytest tests/test_cuda.py -k "dc-padded-wide"` (then compact).
# Logs go to $OUT (default bench-out), one per group, a line per test case (a group cut by its limit
# still names the cases that passed). BENCH_ARGS passes options to bench_ep.py.
# Meant for 2 or more GPUs of one host; on fewer GPUs than a test has ranks, the cuda backend's ranks
# share GPU 0 (tests/shared_gpu.py): the protocol is checked, NVLink is not. NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-bench-out}
limit=${LIMIT_S:-420}
mkdir -p "$out"
status=0

run() {  # run NAME COMMAND...: under the time limit, log to $out/NAME.log, summary on stdout
  local name=$1
  shift
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc"
  tail -n 3 "$out/$name.log"
  [ "$rc" -eq 0 ] || status=1
}

workers=()
if python3 -c "import xdist" 2>/dev/null; then
  workers=(-n "${PYTEST_WORKERS:-3}")
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(exact lifetime worlds stress bench sweep plain)
# the limits' corners among them: top-16, 1024 experts, a small hidden size
shapes=${SWEEP_SHAPES:-2048:64:4 4096:128:8 4096:1024:8 7168:256:4 7168:256:16}
for part in "${parts[@]}"; do
  case $part in
    exact)
      run wire python3 -m pytest -v -rf "${workers[@]}" tests/test_cuda_wire.py tests/test_cuda_launcher.py
      run exact python3 -m pytest -v -rf "${workers[@]}" tests/test_cuda.py \
        -k "not stress and not 4-cuda and not 8-cuda" ;;
    lifetime)
      run lifetime python3 -m pytest -v -rf "${workers[@]}" tests/test_cuda_lifetime.py ;;
    worlds)
      run worlds python3 -m pytest -v -rf "${workers[@]}" tests/test_cuda.py -k "4-cuda or 8-cuda" ;;
    stress)
      run stress python3 -m pytest -v -rf "${workers[@]}" tests/test_cuda.py -k stress ;;
    bench)
      # BENCH_ARGS: bench_ep.py options, word-split (say, "--tokens 16 128 512" in one call and
      # "--tokens 4096 8192" in the next on a machine lent for 10-minute calls)
      # shellcheck disable=SC2086
      run bench env PYTHONPATH=. python3 benchmarks/bench_ep.py --vdev --out "$out/bench" ${BENCH_ARGS:-}
      # the targets this run measured, best mode each
      [ -f "$out/bench/results.csv" ] && python3 benchmarks/targets.py "$out/bench/results.csv" \
        | tee "$out/targets.md" ;;
    sweep)
      # shellcheck disable=SC2086
      run sweep env PYTHONPATH=. python3 benchmarks/bench_ep.py --out "$out/sweep" --shapes $shapes \
        --tokens 128 4096 --maxvio 0 --syncs sw tff ;;
    plain)
      # shellcheck disable=SC2086
      run plain env PYTHONPATH=. python3 benchmarks/one_gpu.py --out "$out/one-gpu" ${ONE_GPU_ARGS:-} ;;
    *)
      echo "unknown part '$part' (exact, lifetime, worlds, stress, bench, sweep, plain)" >&2
      exit 2 ;;
  esac
done
exit $status
