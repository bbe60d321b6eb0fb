#!/usr/bin/env bash
# Everything this project checks on a GPU machine, in one go: the GPU tests (bit for bit against the
# oracle, stress, timeouts, CUDA graphs, wire images), then the side-by-side benchmark.
#   benchmarks/run_gpu_checks.sh [output folder]     (default: bench-out)
# Needs 2 or more GPUs of one host; NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:-bench-out}
mkdir -p "$out"
status=0
python3 -m pytest -q tests/test_cuda_wire.py tests/test_cuda.py || status=1
PYTHONPATH=. python3 benchmarks/bench_ep.py --vdev --out "$out/bench" || status=1
exit $status
