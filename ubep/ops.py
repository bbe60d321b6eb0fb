"""ubep as torch custom ops: ``torch.ops.ubep.dispatch`` and ``torch.ops.ubep.combine`` trace under
``torch.compile`` with no graph break, and (the padded layout on the cuda backend) capture in CUDA
graphs. docs/OPS.md has the schemas and an example.

    ubep::dispatch(int buffer, Tensor x, Tensor topk_idx, Tensor topk_weights)
        -> (Tensor recv_x, Tensor tokens_per_expert, Tensor recv_weights, Tensor[] routes)
    ubep::combine(int buffer, Tensor expert_out, Tensor topk_weights, Tensor recv_weights,
                  Tensor[] routes, str reduce, bool weighted) -> Tensor y

``buffer`` is a Buffer's op id (:func:`op_id`): ops take tensors and primitives only, so a live
Buffer is found by an integer in a registry that holds it weakly. ``routes`` is the dispatch's
handle as tensors (``ubep.backends.route_tensors``: a CPU int64 header, then the backend's routing
tensors); combine rebuilds the :class:`~ubep.backends.base.Handle` from ``routes``, the source's
``topk_weights`` and the rows' ``recv_weights``. Both ops call the Buffer's own checks and its
backend's primitives, so they give the Buffer's bits, forward and backward.

Autograd (``register_autograd``) routes the gradients through two more ops, so that compiled
backward graphs hold ops rather than Python: ``ubep::dispatch_backward`` (an unweighted
``reduce="source"`` combine of the row gradients, and ``return_pair_values`` of the weight
gradients) and ``ubep::combine_backward`` (``dispatch_like`` of ``grad_y``, the rows weighted, and
``return_pair_values`` of the fp32 dot products), as ``Buffer``'s ``_Dispatch`` / ``_Combine`` do.

Every op is a collective over the Buffer's group: every rank must run the same ops in the same
order, as with ``Buffer``. The compact layout's row count is data dependent: its fake
implementation gives it an unbacked symbolic size, its real one waits on the host once for it
(as ``Buffer.dispatch`` does), so it cannot be captured in a CUDA graph; the padded layout has
static shapes ``[E_local, W * max_tokens_per_rank, H]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ubep import op_ids
from ubep.backends import route_tensors
from ubep.backends.base import Handle
from ubep.backends.route_tensors import CODECS, HOST_HEADER
from ubep.buffer import Buffer
from ubep.config import EPConfig


def op_id(buf: Buffer) -> int:
    """The op id of ``buf`` (``Buffer.op_id``, taken when it was made)."""
    return buf.op_id


def buffer_of(buffer: int) -> Buffer:
    """The live Buffer of op id ``buffer``; ``RuntimeError`` if it is unknown, collected or
    destroyed."""
    buf, given = op_ids.lookup(buffer)
    if buf is None:
        why = "belonged to a Buffer that was deleted" if given else "was never given (ubep.ops.op_id)"
        raise RuntimeError(f"ubep op: no live Buffer has op id {buffer}: the id {why}")
    if buf._backend.destroyed:
        raise RuntimeError(f"ubep op: the Buffer of op id {buffer} was destroyed (Buffer.destroy()); "
                           "create a new Buffer and use its op id")
    if buf.balance != "none":
        raise RuntimeError(f"ubep op: op id {buffer} is a BalancedBuffer, whose rows are segments of a "
                           "per-batch plan the ops do not carry; call its own dispatch and combine")
    return buf


# -- routes: the handle as tensors ---------------------------------------------------------------


def _handle(buffer: int, buf: Buffer, topk_weights: Tensor, recv_weights: Tensor, routes: list[Tensor],
            tokens_per_expert: Tensor | None = None) -> Handle:
    """The Handle of the dispatch that returned ``routes``, after checking every input against the
    Buffer (before any communication)."""
    cfg = buf.config
    buf._check_tensor("topk_weights", topk_weights, (torch.float32,), (topk_weights.shape[0], cfg.top_k))
    words = route_tensors.host_words(buffer, buf.backend_name, cfg, buf.device, routes,
                                     topk_weights.shape[0])
    rows = (cfg.num_local_experts, cfg.expert_capacity) if cfg.layout == "padded" else (words[2],)
    buf._check_tensor("recv_weights", recv_weights, (torch.float32,), rows)
    return route_tensors.unpack(words, buf.backend_name, cfg, routes, topk_weights, recv_weights,
                                tokens_per_expert)


# -- the ops -------------------------------------------------------------------------------------

DISPATCH = ("(int buffer, Tensor x, Tensor topk_idx, Tensor topk_weights) -> (Tensor recv_x, "
            "Tensor tokens_per_expert, Tensor recv_weights, Tensor[] routes)")
COMBINE = ("(int buffer, Tensor expert_out, Tensor topk_weights, Tensor recv_weights, Tensor[] routes, "
           "str reduce, bool weighted) -> Tensor")
DISPATCH_BACKWARD = ("(int buffer, Tensor grad_recv_x, Tensor grad_recv_weights, Tensor topk_weights, "
                     "Tensor recv_weights, Tensor tokens_per_expert, Tensor[] routes, bool need_x, "
                     "bool need_w) -> (Tensor grad_x, Tensor grad_topk_weights)")
COMBINE_BACKWARD = ("(int buffer, Tensor grad_y, Tensor? expert_out, Tensor topk_weights, "
                    "Tensor recv_weights, Tensor[] routes, bool weighted, bool need_out, bool need_w) "
                    "-> (Tensor grad_expert_out, Tensor grad_topk_weights)")


def _fresh(t: Tensor) -> Tensor:
    """``t`` at the start of a storage of its own, like the fake implementation's outputs (the
    reference's counts are a slice of its count matrix's column sums; ``E_local`` words)."""
    return t.clone() if t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes else t


@torch.library.custom_op("ubep::dispatch", mutates_args=(), schema=DISPATCH)
def _dispatch_op(buffer: int, x: Tensor, topk_idx: Tensor, topk_weights: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    buf = buffer_of(buffer)
    buf._check_dispatch(x, topk_idx, topk_weights)
    recv_x, recv_weights, handle = buf._backend.dispatch(x, topk_idx, topk_weights)
    routes = route_tensors.pack(buffer, buf.backend_name, handle, topk_idx)
    return recv_x, _fresh(handle.tokens_per_expert), recv_weights, routes


@torch.library.custom_op("ubep::combine", mutates_args=(), schema=COMBINE)
def _combine_op(buffer: int, expert_out: Tensor, topk_weights: Tensor, recv_weights: Tensor,
                routes: list[Tensor], reduce: str, weighted: bool) -> Tensor:
    buf = buffer_of(buffer)
    handle = _handle(buffer, buf, topk_weights, recv_weights, routes)
    buf._check_combine(expert_out, handle, reduce, weighted)
    return buf._backend.combine(expert_out, handle, reduce, weighted)


@torch.library.custom_op("ubep::dispatch_backward", mutates_args=(), schema=DISPATCH_BACKWARD)
def _dispatch_backward_op(buffer: int, grad_recv_x: Tensor, grad_recv_weights: Tensor,
                          topk_weights: Tensor, recv_weights: Tensor, tokens_per_expert: Tensor,
                          routes: list[Tensor], need_x: bool, need_w: bool) -> tuple[Tensor, Tensor]:
    """``Buffer``'s ``_Dispatch.backward``: the row gradients home, summed as an unweighted
    ``reduce="source"`` combine; the weight gradients back to their ``(t, k)`` slots. A gradient
    not needed is zeros and costs no communication."""
    buf = buffer_of(buffer)
    handle = _handle(buffer, buf, topk_weights, recv_weights, routes, tokens_per_expert)
    num_tokens, hidden = handle.num_tokens, grad_recv_x.shape[-1]
    grad_x = (buf._backend.combine(grad_recv_x.contiguous(), handle, "source", False) if need_x
              else grad_recv_x.new_zeros(num_tokens, hidden))
    grad_w = (buf._backend.return_pair_values(grad_recv_weights.reshape(-1), handle) if need_w
              else topk_weights.new_zeros(num_tokens, buf.config.top_k))
    return grad_x, grad_w


@torch.library.custom_op("ubep::combine_backward", mutates_args=(), schema=COMBINE_BACKWARD)
def _combine_backward_op(buffer: int, grad_y: Tensor, expert_out: Tensor | None, topk_weights: Tensor,
                         recv_weights: Tensor, routes: list[Tensor], weighted: bool, need_out: bool,
                         need_w: bool) -> tuple[Tensor, Tensor]:
    """``Buffer``'s ``_Combine.backward``: ``grad_y`` travels as the dispatch did; each row's
    gradient is ``w * grad_y`` (fp32 product, cast); the weight gradient of a row is the fp32 dot
    product of ``grad_y`` with its expert output, sent home. Not needed (or unweighted): zeros.
    ``dispatch_like`` runs whichever is needed, as in ``Buffer``: the ranks' calls stay alike."""
    buf = buffer_of(buffer)
    backend = buf._backend
    handle = _handle(buffer, buf, topk_weights, recv_weights, routes)
    recv_grad = backend.dispatch_like(grad_y.contiguous(), handle)
    if not need_out:
        grad_out = torch.zeros_like(recv_grad)
    elif weighted:
        grad_out = (recv_grad.float() * handle.row_weights.view(handle.rows_shape(1))).to(grad_y.dtype)
    else:
        grad_out = recv_grad
    if not (need_w and weighted):  # unweighted, the gate weights had no part in y
        return grad_out, topk_weights.new_zeros(handle.num_tokens, buf.config.top_k)
    if expert_out is None:
        raise ValueError("ubep::combine_backward: the weight gradient needs expert_out")
    dots = (recv_grad.float() * expert_out.float()).sum(-1)
    return grad_out, backend.return_pair_values(dots.reshape(-1), handle)


# -- fake (meta) implementations ------------------------------------------------------------------


def most_rows(cfg: EPConfig) -> int:
    """The most compact receive rows a rank can get: every source's ``T_max`` tokens, each with
    ``min(K, E_local)`` pairs here (the bound of the unbacked row count)."""
    return cfg.world_size * cfg.max_tokens_per_rank * min(cfg.top_k, cfg.num_local_experts)


@_dispatch_op.register_fake
def _dispatch_fake(buffer, x, topk_idx, topk_weights):
    buf = buffer_of(buffer)
    cfg, codec = buf.config, CODECS[buf.backend_name]
    if cfg.layout == "padded":
        rows = (cfg.num_local_experts, cfg.expert_capacity)
    else:  # data dependent: known once the counts are exchanged
        rows = (torch.library.get_ctx().new_dynamic_size(min=0, max=most_rows(cfg)),)
    host = torch.empty(HOST_HEADER + codec.num_host_words(cfg), dtype=torch.int64, device="cpu")
    device = [x.new_empty(shape, dtype=dtype) for shape, dtype in codec.shapes(cfg, x.shape[0])]
    return (x.new_empty((*rows, cfg.hidden)), x.new_empty(cfg.num_local_experts, dtype=torch.int64),
            x.new_empty(rows, dtype=torch.float32), [host, *device])


@_combine_op.register_fake
def _combine_fake(buffer, expert_out, topk_weights, recv_weights, routes, reduce, weighted):
    return expert_out.new_empty(topk_weights.shape[0], expert_out.shape[-1])


@_dispatch_backward_op.register_fake
def _dispatch_backward_fake(buffer, grad_recv_x, grad_recv_weights, topk_weights, recv_weights,
                            tokens_per_expert, routes, need_x, need_w):
    return (grad_recv_x.new_empty(topk_weights.shape[0], grad_recv_x.shape[-1]),
            torch.empty_like(topk_weights))


@_combine_backward_op.register_fake
def _combine_backward_fake(buffer, grad_y, expert_out, topk_weights, recv_weights, routes, weighted,
                           need_out, need_w):
    return grad_y.new_empty((*recv_weights.shape, grad_y.shape[-1])), torch.empty_like(topk_weights)


# -- autograd --------------------------------------------------------------------------------------


def _dispatch_setup(ctx, inputs, output) -> None:
    buffer, _x, _topk_idx, topk_weights = inputs
    _recv_x, tokens_per_expert, recv_weights, routes = output
    ctx.buffer = buffer
    ctx.save_for_backward(topk_weights, recv_weights, tokens_per_expert, *routes)


def _dispatch_backward(ctx, grad_recv_x, _grad_counts, grad_recv_weights, _grad_routes):
    topk_weights, recv_weights, tokens_per_expert, *routes = ctx.saved_tensors
    _, need_x, _, need_w = ctx.needs_input_grad
    if grad_recv_x is None:  # recv_x unused: zero row gradients (the shape of the receive rows)
        grad_recv_x = recv_weights.new_zeros(*recv_weights.shape, buffer_of(ctx.buffer).config.hidden)
    if grad_recv_weights is None:
        grad_recv_weights = torch.zeros_like(recv_weights)
    grad_x, grad_w = torch.ops.ubep.dispatch_backward(ctx.buffer, grad_recv_x, grad_recv_weights,
                                                      topk_weights, recv_weights, tokens_per_expert,
                                                      routes, need_x, need_w)
    return None, grad_x if need_x else None, None, grad_w if need_w else None


def _combine_setup(ctx, inputs, output) -> None:
    buffer, expert_out, topk_weights, recv_weights, routes, _reduce, weighted = inputs
    ctx.buffer, ctx.weighted, ctx.num_routes = buffer, weighted, len(routes)
    # the expert outputs are kept only for the weight gradient (inputs come before routes, so
    # their flat needs_input_grad positions are the schema's)
    ctx.keeps_out = weighted and ctx.needs_input_grad[2]
    kept = [expert_out] if ctx.keeps_out else []
    ctx.save_for_backward(topk_weights, recv_weights, *routes, *kept)


def _combine_backward(ctx, grad_y):
    saved = ctx.saved_tensors
    topk_weights, recv_weights = saved[:2]
    routes = list(saved[2 : 2 + ctx.num_routes])
    expert_out = saved[-1] if ctx.keeps_out else None
    needs = ctx.needs_input_grad
    need_out, need_w = needs[1], ctx.keeps_out and needs[2]
    grad_out, grad_w = torch.ops.ubep.combine_backward(ctx.buffer, grad_y, expert_out, topk_weights,
                                                       recv_weights, routes, ctx.weighted, need_out,
                                                       need_w)
    return (None, grad_out if need_out else None, grad_w if need_w else None, None,
            [None] * ctx.num_routes, None, None)


_dispatch_op.register_autograd(_dispatch_backward, setup_context=_dispatch_setup)
_combine_op.register_autograd(_combine_backward, setup_context=_combine_setup)


# -- the Python face -------------------------------------------------------------------------------


class Dispatched(NamedTuple):
    """What :func:`dispatch` returns: the op's four outputs and the ``topk_weights`` combine reuses
    (as ``Buffer``'s handle keeps them). ``recv_x`` / ``recv_weights`` / ``tokens_per_expert`` as in
    :class:`ubep.DispatchResult`; ``routes``: the handle as tensors, for :func:`combine`."""

    recv_x: Tensor
    tokens_per_expert: Tensor
    recv_weights: Tensor
    routes: list[Tensor]
    topk_weights: Tensor


def _id(buf: Buffer | int) -> int:
    return buf if isinstance(buf, int) else buf.op_id


def dispatch(buf: Buffer | int, x: Tensor, topk_idx: Tensor, topk_weights: Tensor) -> Dispatched:
    """``buf.dispatch(x, topk_idx, topk_weights)`` through ``torch.ops.ubep.dispatch``; ``buf``: a
    Buffer or its op id."""
    recv_x, tokens_per_expert, recv_weights, routes = torch.ops.ubep.dispatch(_id(buf), x, topk_idx,
                                                                              topk_weights)
    return Dispatched(recv_x, tokens_per_expert, recv_weights, routes, topk_weights)


def combine(buf: Buffer | int, expert_out: Tensor, dispatched: Dispatched, *, reduce: str = "source",
            weighted: bool = True) -> Tensor:
    """``buf.combine(expert_out, handle, reduce=..., weighted=...)`` through
    ``torch.ops.ubep.combine``; ``dispatched``: what :func:`dispatch` returned."""
    return torch.ops.ubep.combine(_id(buf), expert_out, dispatched.topk_weights, dispatched.recv_weights,
                                  dispatched.routes, reduce, weighted)
