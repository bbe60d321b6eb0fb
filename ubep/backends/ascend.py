"""The Ascend backend: binds ``torch.ops.ubep_ascend`` (the Ascend C operator package, ``ascend_ops/``).

Each call is one kernel launch of ``NPU_AIVS`` AIVs on an NPU (``TWIN_AIVS`` threads on the CPU twin):
``dispatch`` (a count group and a token group of AIVs, split by the op's host tiling; Data-as-Flag rows
into peer windows, UBEP's hop-balanced mapper) or
``combine`` (rows back to their sources, reduced there). ``dispatch_like`` runs the dispatch kernel again
on the handle's routing; ``return_pair_values`` is the combine kernel in its ``pairs`` mode (one fp32 per
row back to its ``(t, k)`` slot).

Every die owns a window that all dies write into (docs/ASCEND.md); the kernels find every die's window
in the HCCL context of the op's group, as MC2 kernels do. The windows belong to the process group and
outlive its Buffers, as HCCL's window does on an NPU (``ascend_windows``). A Buffer prepares them on
creation (the ``prepare`` op: zeros, sp sentinels, then a meeting of every die), and again before a call
when another layer's Buffer prepared them since.

Calls are numbered per group, on the device: every AIV keeps the number of its last call in its
die's window header and takes the next one at the start of each kernel (a preparation resets the
counters, having zeroed every flag), so the numbers run 1, 2, 3, ... on every rank across all the
group's Buffers, and a launch replayed from an NPU graph gets a new one. Call ``e``
uses window slot ``e & 1``. The host gives the kernels only the call's ``code`` (``base.call_code``,
the operation and the handle it reuses), above bit ``CALL_BITS`` of the epoch ``e | code <<
CALL_BITS`` that every flag, record and count message of the call carries: ranks that called
different operations wait for words that never come and raise :class:`EPCommError` instead of
mixing two calls.

NPU graphs: a call inside a capture is recorded like any other (its status words are read at
``synchronize()``). A layout switch re-prepares the windows, which would pull them from under a
graph's replays: a window preparation refuses to be captured, and once a graph captured calls of
one layout on a group, a Buffer of another layout on that group refuses to run.

A rank whose peers do not arrive raises :class:`EPCommError` naming its rank and the phase after
``config.timeout_s``; the group's windows are then in an unknown state until a new Buffer prepares
them.

No call makes the host wait for the device but a compact dispatch, which reads its output's size
(``tokens_per_expert``) once. A kernel's timeout reaches the host through its status words
(``ascend_status``): on the CPU twin the call itself raises, on an NPU the next call or
``synchronize()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends.ascend_library import load_ops
from ubep.backends.ascend_status import StatusWatch, npu_capturing
from ubep.backends.ascend_windows import group_windows, window_bytes, window_layout
from ubep.backends.base import CALL_BITS, Backend, Handle, call_code
from ubep.backends.lifetime import pin_for_graphs
from ubep.config import EPConfig

TWIN_AIVS = 4  # AIV threads per die on the CPU twin
NPU_AIVS = 48  # AIVs of an Atlas A3 die


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
        self.windows = group_windows(config, group, device)
        self.n_workers = NPU_AIVS if on_npu else TWIN_AIVS
        self.symmetric_bytes = window_bytes(config)
        self.layout = window_layout(config)
        self.status = StatusWatch(device, config.rank, config.timeout_s)
        self._prepare()

    def _prepare(self) -> None:
        """Fills this layer's window on every die and meets every die (a collective); until it
        succeeds the windows hold no known layout."""
        if npu_capturing():
            raise RuntimeError("backend='ascend': a window preparation (a Buffer's creation, or its first "
                               "call after a Buffer of another layout used the group) cannot be captured in "
                               "an NPU graph; make one eager call of this Buffer before capturing")
        cfg, w = self.config, self.windows
        if w.captured_layout not in (None, self.layout):
            raise RuntimeError(f"backend='ascend': an NPU graph captured calls of the layer "
                               f"{w.captured_layout} (hidden, experts, top_k, max_tokens, dtype, sync) "
                               f"on this group; this Buffer's layer {self.layout} would prepare the "
                               "group's windows again under its replays. Run the other layer on another "
                               "process group")
        self.status.check()  # before launching: a call that raises runs on no die
        w.layout = None
        token = torch.tensor([w.nonce, w.next_preparation()], dtype=torch.int64, device=self.device)
        self._call(torch.ops.ubep_ascend.prepare, token, w.tensors, w.name, cfg.world_size, cfg.rank,
                   cfg.hidden, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, cfg.sync,
                   self.n_workers, cfg.timeout_s)
        w.layout = self.layout

    def _call_code(self, code: int) -> int:
        """The op's ``call_code`` (``code`` above the call number, which the kernels take on the device),
        after preparing the windows again if they hold another layer's layout (every rank decides
        alike: the group's calls are the same sequence everywhere). Raises first for an earlier call
        that timed out, and where the preparation would break a graph's replays."""
        self.status.check()
        if self.windows.layout != self.layout:
            self._prepare()
        if npu_capturing():
            self.windows.captured_layout = self.layout
            pin_for_graphs(self.windows)
        return code << CALL_BITS

    def _call(self, op, *args) -> list[torch.Tensor]:
        """Runs one op; returns its outputs but the status words, which ``self.status`` takes."""
        out = op(*args)
        *outputs, status = out if isinstance(out, tuple) else (out,)  # prepare: the status alone
        self.status.watch(status)
        return outputs

    def synchronize(self) -> None:
        if self.device.type == "npu":
            torch.npu.current_stream(self.device).synchronize()
        self.status.check(wait=True)

    def destroy(self) -> None:
        if self.device.type == "npu":
            torch.npu.current_stream(self.device).synchronize()
        super().destroy()

    def _dispatch_op(self, x_TH, topk_idx_TK, topk_weights_TK, code: int):
        cfg, code_bits = self.config, self._call_code(code)
        return self._call(torch.ops.ubep_ascend.dispatch, x_TH.contiguous(), topk_idx_TK.long().contiguous(),
                          topk_weights_TK.detach().float().contiguous(), self.windows.tensors,
                          self.windows.name, cfg.world_size, cfg.rank, cfg.num_experts,
                          cfg.max_tokens_per_rank, cfg.layout == "padded", cfg.sync, code_bits,
                          self.n_workers, cfg.timeout_s)

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        cfg = self.config
        with self.timer.phase("dispatch: kernel"):
            recv_x, recv_w, tpe, rows, pair_w, pair_base, counts = self._dispatch_op(
                x_TH, topk_idx_TK, topk_weights_TK, call_code("dispatch"))
        if cfg.layout == "padded":  # fixed capacity: no host synchronization
            num_rows = cfg.num_local_experts * cfg.expert_capacity
        else:  # the one synchronization of a compact dispatch; after it the kernel's status is final
            num_rows = int(tpe.sum())
            self.status.check()
        routes = Routes(topk_idx_TK.long(), topk_weights_TK.detach().float(), rows, pair_w, pair_base, counts)
        self.dispatches += 1
        handle = Handle(cfg, x_TH.shape[0], topk_weights_TK, recv_w[:num_rows], tpe, num_rows, None, routes,
                        self.dispatches)
        recv_weights = handle.row_weights.clone().view(handle.rows_shape())
        return recv_x[:num_rows].view(handle.rows_shape(cfg.hidden)), recv_weights, handle

    def dispatch_like(self, x_TH, handle):
        with self.timer.phase("dispatch: kernel"):
            recv_x = self._dispatch_op(x_TH, handle.routes.topk_idx, handle.routes.topk_weights,
                                       call_code("dispatch_like", handle.call))[0]
        return recv_x[: handle.num_rows].view(handle.rows_shape(x_TH.shape[1]))

    def _combine_op(self, rows, handle: Handle, reduce: str, weighted: bool) -> torch.Tensor:
        code = (call_code("return_pair_values", handle.call) if reduce == "pairs"
                else call_code("combine", handle.call, reduce, weighted))
        cfg, r, code_bits = self.config, handle.routes, self._call_code(code)
        return self._call(torch.ops.ubep_ascend.combine, rows.contiguous(), r.topk_idx, r.topk_weights,
                          r.recv_rows, r.recv_pair_weights, r.recv_pair_base, r.recv_counts,
                          self.windows.tensors, self.windows.name, cfg.world_size, cfg.rank, cfg.num_experts,
                          cfg.hidden, cfg.dtype, reduce, weighted, cfg.sync, code_bits,
                          self.n_workers, cfg.timeout_s)[0]

    def combine(self, expert_out, handle, reduce, weighted):
        with self.timer.phase("combine: kernel"):
            rows = expert_out.reshape(handle.num_rows, expert_out.shape[-1])
            return self._combine_op(rows, handle, reduce, weighted)

    def return_pair_values(self, values_R, handle):
        with self.timer.phase("combine: kernel"):
            return self._combine_op(values_R.float().reshape(-1), handle, "pairs", False)
