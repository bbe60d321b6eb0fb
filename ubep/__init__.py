"""ubep: deterministic expert-parallel dispatch and combine for Mixture-of-Experts models.

    buf = ubep.Buffer(group, hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T_max,
                      dtype=torch.bfloat16)
    res = buf.dispatch(x_TH, topk_idx_TK, topk_weights_TK)       # rows for this rank's experts
    y_TH = buf.combine(experts(res.recv_x, res.tokens_per_expert), res.handle)
"""

from ubep.backends.base import EPCommError, Handle, WireStats
from ubep.backends.lifetime import release_graph_memory
from ubep.balanced import BalancedBuffer, BalancedDispatchResult
from ubep.buffer import Buffer, DispatchResult
from ubep.config import EPConfig

__all__ = ["BalancedBuffer", "BalancedDispatchResult", "Buffer", "DispatchResult", "EPCommError",
           "EPConfig", "Handle", "WireStats", "release_graph_memory"]
__version__ = "0.1.0"
