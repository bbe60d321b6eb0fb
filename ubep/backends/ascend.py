"""The Ascend backend: binds ``torch.ops.ubep_ascend`` (the Ascend C operator package, ``ascend_ops/``).

Each call is one kernel launch of ``NPU_AIVS`` AIVs on an NPU (``TWIN_AIVS`` threads on the CPU twin):
``dispatch`` (a count group and a token group of AIVs, split by the op's host tiling; Data-as-Flag rows
into peer windows, the hop-aware mapper) or
``combine`` (rows back to their sources, reduced there). ``dispatch_like`` runs the dispatch kernel again
on the handle's routing; ``return_pair_values`` is the combine kernel in its ``pairs`` mode (one fp32 per
row back to its ``(t, k)`` slot).

Every die owns a window that all dies write into (docs/ASCEND.md); the kernels find every die's window
in the HCCL context of the op's group, as MC2 kernels do. On NPUs the windows are HCCL's own (each
rank's ``windowsIn`` of the group's communicator, ``HCCL_BUFFSIZE`` MB): the ops get the communicator's
name and no window tensors. That path has never run (no NPU here). On the CPU twin a rank process is a
die and its window is a file in ``/dev/shm`` that every rank maps; the file name comes from an id rank 0
broadcasts, each file is unlinked once every rank has mapped it, and each launch builds the twin's HCCL
group over the mappings.

Calls are numbered (epochs 1, 2, 3, ... on every rank); call ``e`` uses window slot ``e & 1``. A rank
whose peers do not arrive raises :class:`EPCommError` naming its rank and the phase after
``config.timeout_s``; the buffer is unusable after that.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends.ascend_library import load_ops
from ubep.backends.base import Backend, EPCommError, Handle
from ubep.config import EPConfig

TWIN_AIVS = 4  # AIV threads per die on the CPU twin
NPU_AIVS = 48  # AIVs of an Atlas A3 die


def window_bytes(cfg: EPConfig) -> int:
    """Bytes of one die's window for this layer (on the CPU twin with the lock table that follows it)."""
    return torch.ops.ubep_ascend.window_bytes(cfg.world_size, cfg.hidden, cfg.num_experts, cfg.top_k,
                                              cfg.max_tokens_per_rank, cfg.dtype, cfg.sync)


def check_hccl_buffsize(cfg: EPConfig) -> None:
    """ValueError naming ``HCCL_BUFFSIZE`` and the bytes needed when HCCL's window (``HCCL_BUFFSIZE`` MB,
    200 when unset) cannot hold this layer's window; the same check as the ops' host tiling, asked before
    any communication."""
    load_ops()
    problem = torch.ops.ubep_ascend.hccl_window_problem(
        cfg.world_size, cfg.hidden, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, cfg.sync,
        os.environ.get("HCCL_BUFFSIZE"))
    if problem:
        raise ValueError(f"backend='ascend': {problem}")


def worker_split(cfg: EPConfig, num_aivs: int = TWIN_AIVS) -> tuple[int, int]:
    """``(n_count, n_token)``: the dispatch op's own AIV split for this layer, from its host tiling (the
    appendix-9 cost model on a CM384-like fabric of W dies, ``ascend_ops/op_host/split.h``)."""
    load_ops()
    n_count, n_token = torch.ops.ubep_ascend.worker_split(
        cfg.world_size, cfg.hidden, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, num_aivs)
    return n_count, n_token


@dataclass(frozen=True, eq=False)
class Routes:
    """What the dispatch kernel recorded, reused by combine and backward.

    Source side: ``topk_idx`` ``[T, K]`` int64 and ``topk_weights`` ``[T, K]`` fp32 (detached).
    Destination side, per source ``s`` and staged token ``j``: ``recv_rows`` ``[W, T_max, K]`` int32
    (receive row of each pair held here, else -1), ``recv_pair_weights`` ``[W, T_max, K]`` fp32,
    ``recv_pair_base`` ``[W, T_max]`` int32 (the token's first pair index in the batch back to
    ``s``), ``recv_counts`` ``[W, 2]`` int32 (tokens and pairs received from each source).
    """

    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    recv_rows: torch.Tensor
    recv_pair_weights: torch.Tensor
    recv_pair_base: torch.Tensor
    recv_counts: torch.Tensor


class _HcclWindows:
    """The windows of an NPU group: HCCL's, which the kernels reach through the op's HCCL context;
    ``group`` is the communicator's name that the ops pass to HCCL, ``tensors`` is empty."""

    def __init__(self, cfg: EPConfig, group: dist.ProcessGroup | None, device: torch.device):
        check_hccl_buffsize(cfg)
        pg = group if group is not None else dist.group.WORLD
        self.group = pg._get_backend(device).get_hccl_comm_name(cfg.rank)
        self.tensors: list[torch.Tensor] = []
        self.nbytes = window_bytes(cfg)


class _SharedWindows:
    """One ``/dev/shm`` window per rank, mapped by every rank: ``tensors[r]`` is rank r's, uint8; ``group``
    names the twin's HCCL group over them."""

    def __init__(self, cfg: EPConfig, group: dist.ProcessGroup | None):
        sync = cfg.sync
        nbytes = window_bytes(cfg)
        token = [secrets.token_hex(8) if cfg.rank == 0 else None]
        dist.broadcast_object_list(token, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        self.group = f"ubep-{token[0]}"
        paths = [f"/dev/shm/{self.group}-{r}" for r in range(cfg.world_size)]
        fd = os.open(paths[cfg.rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            own = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        torch.ops.ubep_ascend.prepare_window(torch.frombuffer(own, dtype=torch.uint8), cfg.world_size,
                                             cfg.rank, cfg.hidden, cfg.num_experts, cfg.top_k,
                                             cfg.max_tokens_per_rank, cfg.dtype, sync)
        dist.barrier(group=group)
        self.maps = []
        for r, path in enumerate(paths):
            if r == cfg.rank:
                self.maps.append(own)
                continue
            with open(path, "r+b") as f:
                self.maps.append(mmap.mmap(f.fileno(), nbytes))
        dist.barrier(group=group)
        os.unlink(paths[cfg.rank])  # every rank holds its mapping; no file outlives the buffer
        self.tensors = [torch.frombuffer(m, dtype=torch.uint8) for m in self.maps]
        self.nbytes = nbytes


class AscendBackend(Backend):
    name = "ascend"

    def __init__(self, config: EPConfig, group: dist.ProcessGroup | None, device: torch.device):
        super().__init__(config, group, device)
        if device.type not in ("cpu", "npu"):
            raise ValueError(f"backend='ascend' runs on NPUs or on its CPU twin; the buffer's device is "
                             f"{device}")
        if config.hidden > 8192:
            raise ValueError(f"hidden must be <= 8192 for backend='ascend' (a row and its fp32 sums fit "
                             f"in an AIV's 192 KiB UB), got {config.hidden}")
        load_ops()
        on_npu = device.type == "npu"
        self.windows = _HcclWindows(config, group, device) if on_npu else _SharedWindows(config, group)
        self.n_workers = NPU_AIVS if on_npu else TWIN_AIVS
        self.symmetric_bytes = self.windows.nbytes
        self.epoch = 0

    def _next_epoch(self) -> int:
        if self.epoch >= 2**63 - 1:
            raise EPCommError(f"ubep rank {self.config.rank}: the buffer made 2^63 - 1 calls; make a new one")
        self.epoch += 1
        return self.epoch

    def _call(self, op, *args):
        try:
            return op(*args)
        except RuntimeError as err:
            message = str(err).splitlines()[0]
            if "did not complete within" in message:
                raise EPCommError(message) from None
            raise

    def _dispatch_op(self, x_TH, topk_idx_TK, topk_weights_TK):
        cfg = self.config
        return self._call(torch.ops.ubep_ascend.dispatch, x_TH.contiguous(), topk_idx_TK.long().contiguous(),
                          topk_weights_TK.detach().float().contiguous(), self.windows.tensors,
                          self.windows.group, cfg.world_size, cfg.rank, cfg.num_experts,
                          cfg.max_tokens_per_rank, cfg.layout == "padded", cfg.sync, self._next_epoch(),
                          self.n_workers, cfg.timeout_s)

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        cfg = self.config
        with self.timer.phase("dispatch: kernel"):
            recv_x, recv_w, tpe, rows, pair_w, pair_base, counts = self._dispatch_op(
                x_TH, topk_idx_TK, topk_weights_TK)
        num_rows = (cfg.num_local_experts * cfg.expert_capacity if cfg.layout == "padded"
                    else int(tpe.sum()))
        routes = Routes(topk_idx_TK.long(), topk_weights_TK.detach().float(), rows, pair_w, pair_base, counts)
        handle = Handle(cfg, x_TH.shape[0], topk_weights_TK, recv_w[:num_rows], tpe, num_rows, None, routes)
        recv_weights = handle.row_weights.clone().view(handle.rows_shape())
        return recv_x[:num_rows].view(handle.rows_shape(cfg.hidden)), recv_weights, handle

    def dispatch_like(self, x_TH, handle):
        with self.timer.phase("dispatch: kernel"):
            recv_x = self._dispatch_op(x_TH, handle.routes.topk_idx, handle.routes.topk_weights)[0]
        return recv_x[: handle.num_rows].view(handle.rows_shape(x_TH.shape[1]))

    def _combine_op(self, rows, handle: Handle, reduce: str, weighted: bool) -> torch.Tensor:
        cfg, r = self.config, handle.routes
        return self._call(torch.ops.ubep_ascend.combine, rows.contiguous(), r.topk_idx, r.topk_weights,
                          r.recv_rows, r.recv_pair_weights, r.recv_pair_base, r.recv_counts,
                          self.windows.tensors, self.windows.group, cfg.world_size, cfg.rank, cfg.num_experts,
                          cfg.hidden, cfg.dtype, reduce, weighted, cfg.sync, self._next_epoch(),
                          self.n_workers, cfg.timeout_s)

    def combine(self, expert_out, handle, reduce, weighted):
        with self.timer.phase("combine: kernel"):
            rows = expert_out.reshape(handle.num_rows, expert_out.shape[-1])
            return self._combine_op(rows, handle, reduce, weighted)

    def return_pair_values(self, values_R, handle):
        with self.timer.phase("combine: kernel"):
            return self._combine_op(values_R.float().reshape(-1), handle, "pairs", False)
