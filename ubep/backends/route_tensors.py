"""Each backend's ``Routes`` as a list of tensors and back: how a dispatch's routing crosses the
boundary of the torch custom ops (``ubep.ops``), whose schemas carry tensors and primitives only.

A packed route list is ``[host, *device]``, the same schema for every backend:

- ``host``: CPU int64 ``[HOST_HEADER + n]``: the Buffer's op id, the handle's call number
  (``Handle.call``), its receive rows (``Handle.num_rows``), then the backend's own host integers
  (the reference's split sizes; none for cuda and ascend). It lives on the CPU so that unpacking
  never waits for a device: a captured combine reads the words of its capture, as a combine given
  the capture's Handle would.
- ``device``: the backend's routing tensors on the Buffer's device, integer dtypes only (fp32
  travels as its int32 bits, so autograd sees no differentiable output), each of a shape fixed by
  the configuration and ``T`` alone, so that fake (meta) implementations know it without running
  the backend. A tensor that would share storage with an input of the dispatch is cloned (a
  custom op's outputs may alias neither its inputs nor each other).

What each backend carries (``W`` ranks, ``T`` tokens here, ``T_max``, ``K``):

- reference: its routes are data-dependent lengths, padded here to their bounds (one copy each;
  the reference is the oracle, not the fast path): ``send_token_idx [T * min(W, K)]`` int64,
  ``return_slots [T * K]`` int64, ``recv_rows [W * T_max, K]`` int64, ``recv_pair_weights`` as
  int32 ``[W * T_max, K]``; its four split-size vectors (``W`` each) in the host words.
- cuda: zero copy: ``idx_P [T * K]`` int64 (cloned only when it is ``topk_idx`` itself),
  ``sent_WT [W, T_max]`` int8, ``rows_WMK [W, T_max, K]`` int64, ``weights_WMK`` as int32.
- ascend: zero copy: ``topk_idx [T, K]`` int64 (cloned only when it is the input itself),
  ``recv_rows [W, T_max, K]`` int32, ``recv_pair_weights`` as int32, ``recv_pair_base [W, T_max]``
  int32, ``recv_counts [W, 2]`` int32; its ``topk_weights`` are the combine's own input.

No backend's ``combine``, ``dispatch_like`` or ``return_pair_values`` reads a handle's
``tokens_per_expert`` (the cuda kernel takes its pointer, and writes it only in a
dispatch), so the route list does not carry it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ubep.backends.ascend import Routes as AscendRoutes
from ubep.backends.base import Handle
from ubep.backends.reference import Routes as ReferenceRoutes
from ubep.config import EPConfig

HOST_HEADER = 3  # op id, call number, receive rows
Shape = tuple  # of ints or SymInts


@dataclass(frozen=True)
class RouteCodec:
    """How one backend's ``Routes`` become tensors and back.

    - ``shapes(cfg, T)``: ``[(shape, dtype)]`` of the device tensors;
    - ``num_host_words(cfg)``: how many backend integers follow the host header;
    - ``pack(routes, cfg, T, topk_idx)``: ``(host integers, device tensors)``;
    - ``unpack(host, device, cfg, T, topk_weights)``: the backend's ``Routes``.
    """

    shapes: Callable[[EPConfig, int], list[tuple[Shape, torch.dtype]]]
    num_host_words: Callable[[EPConfig], int]
    pack: Callable[..., tuple[list[int], list[torch.Tensor]]]
    unpack: Callable[..., object]


def _owned(t: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``t``, or a clone of it where it shares storage with one of ``inputs`` (empty tensors too:
    torch's alias check compares storages, not bytes)."""
    storage = t.untyped_storage()._cdata
    return t.clone() if any(i.untyped_storage()._cdata == storage for i in inputs) else t


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> its int32 bits (a view: no copy)."""
    return t.view(torch.int32)


def _floats(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.float32)


# -- reference ---------------------------------------------------------------------------------


def _reference_shapes(cfg: EPConfig, num_tokens) -> list[tuple[Shape, torch.dtype]]:
    w, k, tm = cfg.world_size, cfg.top_k, cfg.max_tokens_per_rank
    return [((num_tokens * min(w, k),), torch.int64), ((num_tokens * k,), torch.int64),
            ((w * tm, k), torch.int64), ((w * tm, k), torch.int32)]


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` ``[n, ...]`` in the first ``n`` rows of a fresh zero tensor ``[rows, ...]``."""
    out = t.new_zeros((rows, *t.shape[1:]))
    out[: t.shape[0]] = t
    return out


def _reference_pack(r: ReferenceRoutes, cfg: EPConfig, num_tokens: int, topk_idx: torch.Tensor):
    shapes = _reference_shapes(cfg, num_tokens)
    host = [*r.send_counts, *r.return_counts, *r.recv_counts, *r.recv_pair_counts]
    device = [_padded(r.send_token_idx, shapes[0][0][0]), _padded(r.return_slots, shapes[1][0][0]),
              _padded(r.recv_rows, shapes[2][0][0]), _padded(_bits(r.recv_pair_weights), shapes[3][0][0])]
    return host, device


def _reference_unpack(host: list[int], device: list[torch.Tensor], cfg: EPConfig, num_tokens: int,
                      topk_weights: torch.Tensor) -> ReferenceRoutes:
    w = cfg.world_size
    send, back, recv, recv_pairs = (tuple(host[i * w : (i + 1) * w]) for i in range(4))
    token_idx, slots, rows, weight_bits = device
    n = sum(recv)
    return ReferenceRoutes(token_idx[: sum(send)], send, slots[: sum(back)], back, recv, rows[:n],
                           _floats(weight_bits[:n]), recv_pairs)


REFERENCE = RouteCodec(_reference_shapes, lambda cfg: 4 * cfg.world_size, _reference_pack,
                       _reference_unpack)


# -- cuda --------------------------------------------------------------------------------------


def _cuda_shapes(cfg: EPConfig, num_tokens) -> list[tuple[Shape, torch.dtype]]:
    w, k, tm = cfg.world_size, cfg.top_k, cfg.max_tokens_per_rank
    return [((num_tokens * k,), torch.int64), ((w, tm), torch.int8), ((w, tm, k), torch.int64),
            ((w, tm, k), torch.int32)]


def _cuda_pack(r, cfg: EPConfig, num_tokens: int, topk_idx: torch.Tensor):
    return [], [_owned(r.idx_P, topk_idx), r.sent_WT, r.rows_WMK, _bits(r.weights_WMK)]


def _cuda_unpack(host, device, cfg, num_tokens, topk_weights):
    from ubep.backends.cuda.backend import Routes  # imports Triton: only where cuda runs

    idx, sent, rows, weight_bits = device
    return Routes(idx, sent, rows, _floats(weight_bits))


CUDA = RouteCodec(_cuda_shapes, lambda cfg: 0, _cuda_pack, _cuda_unpack)


# -- ascend ------------------------------------------------------------------------------------


def _ascend_shapes(cfg: EPConfig, num_tokens) -> list[tuple[Shape, torch.dtype]]:
    w, k, tm = cfg.world_size, cfg.top_k, cfg.max_tokens_per_rank
    return [((num_tokens, k), torch.int64), ((w, tm, k), torch.int32), ((w, tm, k), torch.int32),
            ((w, tm), torch.int32), ((w, 2), torch.int32)]


def _ascend_pack(r: AscendRoutes, cfg: EPConfig, num_tokens: int, topk_idx: torch.Tensor):
    return [], [_owned(r.topk_idx, topk_idx), r.recv_rows, _bits(r.recv_pair_weights),
                r.recv_pair_base, r.recv_counts]


def _ascend_unpack(host, device, cfg, num_tokens, topk_weights) -> AscendRoutes:
    idx, rows, weight_bits, base, counts = device
    return AscendRoutes(idx, topk_weights.detach().float(), rows, _floats(weight_bits), base, counts)


ASCEND = RouteCodec(_ascend_shapes, lambda cfg: 0, _ascend_pack, _ascend_unpack)

CODECS = {"reference": REFERENCE, "cuda": CUDA, "ascend": ASCEND}


# -- the route list --------------------------------------------------------------------------------


def pack(op_id: int, backend: str, handle: Handle, topk_idx: torch.Tensor) -> list[torch.Tensor]:
    """``handle`` as ``[host, *device]`` (module docstring); ``topk_idx``: the dispatch's input,
    which no device tensor may share storage with."""
    host, device = CODECS[backend].pack(handle.routes, handle.config, handle.num_tokens, topk_idx)
    header = torch.tensor([op_id, handle.call, handle.num_rows, *host], dtype=torch.int64)
    return [header, *device]


def host_words(op_id: int, backend: str, cfg: EPConfig, device: torch.device, routes: list[torch.Tensor],
               num_tokens: int) -> list[int]:
    """The host words of ``routes`` after checking that they are those of a dispatch of ``backend``
    by the Buffer of ``op_id`` for ``num_tokens`` tokens: ``ValueError`` otherwise (host-side
    metadata only, so before any communication)."""
    codec = CODECS[backend]
    shapes = codec.shapes(cfg, num_tokens)
    header_len = HOST_HEADER + codec.num_host_words(cfg)
    if len(routes) != 1 + len(shapes):
        raise ValueError(f"routes must be the {1 + len(shapes)} tensors of a dispatch of backend "
                         f"{backend!r}, got {len(routes)}")
    host = routes[0]
    if host.device.type != "cpu" or host.dtype != torch.int64 or tuple(host.shape) != (header_len,):
        raise ValueError(f"routes[0] must be the dispatch's CPU int64 [{header_len}] host words, got "
                         f"{host.device} {host.dtype} {list(host.shape)}")
    words = host.tolist()
    if words[0] != op_id:
        raise ValueError(f"routes come from a dispatch of the Buffer of op id {words[0]}, not of op id "
                         f"{op_id}")
    for i, ((shape, dtype), t) in enumerate(zip(shapes, routes[1:], strict=True), start=1):
        if t.dtype != dtype or tuple(t.shape) != tuple(shape) or t.device != device:
            raise ValueError(f"routes[{i}] must be {dtype} {list(shape)} on {device} (a dispatch of "
                             f"{num_tokens} tokens), got {t.dtype} {list(t.shape)} on {t.device}")
    return words


def unpack(words: list[int], backend: str, cfg: EPConfig, routes: list[torch.Tensor],
           topk_weights: torch.Tensor, recv_weights: torch.Tensor,
           tokens_per_expert: torch.Tensor | None = None) -> Handle:
    """The Handle of the dispatch whose ``routes`` (host ``words`` checked by :func:`host_words`)
    these are; ``topk_weights`` ``[T, K]``: the source's, ``recv_weights``: its rows' (the
    dispatch's output). Without ``tokens_per_expert``, an unfilled stand-in: no backend reads a
    handle's counts outside a dispatch (module docstring)."""
    num_tokens, device = topk_weights.shape[0], routes[1].device
    routing = CODECS[backend].unpack(words[HOST_HEADER:], list(routes[1:]), cfg, num_tokens, topk_weights)
    if tokens_per_expert is None:
        tokens_per_expert = torch.empty(cfg.num_local_experts, dtype=torch.int64, device=device)
    return Handle(cfg, num_tokens, topk_weights, recv_weights.reshape(-1), tokens_per_expert, words[2],
                  None, routing, words[1])
