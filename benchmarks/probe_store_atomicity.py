"""Does a data block written over NVLink, or by another SM of the same GPU, ever show its flag before
its payload?

Token-flag fusion (``ubep.protocol``, mode ``tff``) lets a receiver trust a block's payload as soon as
the block's flag shows the current epoch; that holds only if the writes of one block are never seen
flag-first. PTX promises single-copy atomicity for accesses of at most 16 bytes by one thread and
nothing for wider blocks, so this probe measures what the hardware does:

- rank 0 writes ``NUM_BLOCKS`` blocks into rank 1's symmetric buffer, over and over, every 32-bit word
  of a block holding the iteration number, with ``vec``-byte vector stores (one thread per ``vec``
  bytes, one warp per data block, so each iteration of a block is one store instruction);
- rank 1 polls its copy at the same time: one thread reads a block's flag word (the first), then the
  block's threads read every payload word; a payload word older than the flag is a *violation*;
- then the same with the writer on rank 1 itself (another stream), as for a rank's rows to itself.

    PYTHONPATH=. python3 benchmarks/probe_store_atomicity.py          # on 2 GPUs, e.g. nvidia-h200-x2

Prints one row per (block bytes, store width): polls that saw a new flag, and violations.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ubep.launch import run_ranks

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1", TORCH_CUDA_ARCH_LIST="9.0")

NUM_BLOCKS = 264  # two per SM on an H200, so writer and reader both spread over the chip
ITERS = 20000
POLLS = 20000

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

template <int VEC>
__device__ inline void store_vec(uint32_t* p, uint32_t v) {
  if (VEC == 4) {
    asm volatile("st.volatile.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
  } else if (VEC == 8) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %1};" :: "l"(p), "r"(v) : "memory");
  } else {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" :: "l"(p), "r"(v) : "memory");
  }
}

__device__ inline uint32_t load_word(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One CUDA block per data block; thread i stores bytes [i * VEC, (i + 1) * VEC) of it.
template <int VEC>
__global__ void writer(uint32_t* dst, int block_words, int iters) {
  uint32_t* base = dst + (size_t)blockIdx.x * block_words;
  for (uint32_t it = 1; it <= (uint32_t)iters; ++it) {
    store_vec<VEC>(base + threadIdx.x * (VEC / 4), it);
  }
}

// Thread 0 reads the flag word, then every thread checks its payload words against it.
__global__ void reader(const uint32_t* src, int block_words, int polls,
                       unsigned long long* counters) {
  const uint32_t* base = src + (size_t)blockIdx.x * block_words;
  __shared__ uint32_t flag;
  uint32_t last = 0;
  for (int p = 0; p < polls; ++p) {
    if (threadIdx.x == 0) flag = load_word(base);
    __syncthreads();
    uint32_t f = flag;
    if (f != last) {
      for (int w = 1 + threadIdx.x; w < block_words; w += blockDim.x) {
        if (load_word(base + w) < f) atomicAdd(&counters[1], 1ULL);
      }
      if (threadIdx.x == 0) atomicAdd(&counters[0], 1ULL);
      last = f;
    }
    __syncthreads();
  }
}

void launch_writer(int64_t dst, int64_t block_bytes, int64_t vec, int64_t num_blocks, int64_t iters) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  int threads = block_bytes / vec, words = block_bytes / 4;
  auto* p = reinterpret_cast<uint32_t*>(dst);
  if (vec == 4) writer<4><<<num_blocks, threads, 0, stream>>>(p, words, iters);
  else if (vec == 8) writer<8><<<num_blocks, threads, 0, stream>>>(p, words, iters);
  else writer<16><<<num_blocks, threads, 0, stream>>>(p, words, iters);
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "writer launch failed");
}

void launch_reader(torch::Tensor src, int64_t block_bytes, int64_t num_blocks, int64_t polls,
                   torch::Tensor counters) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  int words = block_bytes / 4;
  int threads = words < 128 ? words : 128;
  reader<<<num_blocks, threads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(src.data_ptr()), words, polls,
      reinterpret_cast<unsigned long long*>(counters.data_ptr()));
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "reader launch failed");
}
"""

CPP_SRC = """
void launch_writer(int64_t dst, int64_t block_bytes, int64_t vec, int64_t num_blocks, int64_t iters);
void launch_reader(torch::Tensor src, int64_t block_bytes, int64_t num_blocks, int64_t polls,
                   torch::Tensor counters);
"""

# (block bytes, bytes per thread store): at most 32 threads, so one warp's single store instruction
# writes the whole block (more warps would drift apart and show writer skew, not tearing).
CONFIGS = [(16, 16), (32, 16), (64, 16), (128, 16), (256, 16), (512, 16), (64, 8), (256, 8),
           (32, 4), (128, 4)]


def probe_rank(rank: int, world: int) -> list[dict]:
    import torch.distributed._symmetric_memory as symm_mem
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("ubep_store_probe", CPP_SRC, cuda_sources=CUDA_SRC,
                      functions=["launch_writer", "launch_reader"], verbose=False)
    dev = torch.device("cuda", torch.cuda.current_device())
    max_bytes = max(b for b, _ in CONFIGS)
    buf = symm_mem.empty(NUM_BLOCKS * max_bytes // 4, dtype=torch.int32, device=dev)
    handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
    side = torch.cuda.Stream()
    rows = []
    for path in ("NVLink", "local"):
        for block_bytes, vec in CONFIGS:
            buf.zero_()
            counters = torch.zeros(2, dtype=torch.int64, device=dev)
            torch.cuda.synchronize()
            dist.barrier()
            if rank == 1:
                ext.launch_reader(buf, block_bytes, NUM_BLOCKS, POLLS, counters)
                if path == "local":  # a concurrent writer on this GPU, on another stream
                    with torch.cuda.stream(side):
                        ext.launch_writer(buf.data_ptr(), block_bytes, vec, NUM_BLOCKS, ITERS)
            elif path == "NVLink":
                ext.launch_writer(handle.buffer_ptrs[1], block_bytes, vec, NUM_BLOCKS, ITERS)
            torch.cuda.synchronize()
            dist.barrier()
            if rank == 1:
                seen, bad = counters.tolist()
                rows.append({"path": path, "block_bytes": block_bytes, "store_bytes": vec,
                             "new_flags_seen": seen, "violations": bad})
    return rows


def main() -> int:
    if torch.cuda.device_count() < 2:
        print("needs 2 GPUs", file=sys.stderr)
        return 2
    rows = run_ranks(probe_rank, 2, pg_backend="nccl", timeout_s=900)[1]
    print(f"{NUM_BLOCKS} blocks, {ITERS} writes each, {POLLS} polls each; "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| writer | block bytes | store bytes | new flags seen | payload older than flag |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['block_bytes']} | {r['store_bytes']} | {r['new_flags_seen']} | "
              f"{r['violations']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
