"""Analytical cost model of the dispatch decomposition and its auto-tuner (UBEP appendix 9).

    params = cm384_ascend()                                   # or h200(), or CostParams.from_json(...)
    shape = DispatchShape(tokens=64, experts=256, topk=8, bytes_per_token=14336)
    split = best_split(shape, CM384_AIVS, cm384(256), params)  # n_count=12, n_token=36
    n_count = best_count(shape, 256, flat(1), h200())         # no budget: the count term alone
    bsp = bsp_time(shape, CM384_AIVS, cm384(256), params)      # the global-barrier baseline
    cache = SplitCache(cm384(256), params)                     # re-tunes only on a new token bucket

Files: ``params`` (plain-data costs and presets), ``model`` (group times), ``split`` (search and
BSP), ``calibrate`` (least-squares fit to measured group times), ``cache`` (token buckets), ``vectors``
(splits for the C++ host tiling's test, ``tests/vectors/split.json``).
"""

from ubep.tuning.cache import UNIEP_BUCKET_TOKENS, SplitCache
from ubep.tuning.calibrate import Calibration, Sample, calibrate, predict
from ubep.tuning.model import (
    DispatchShape,
    Traffic,
    count_group_ns,
    per_copy_ns,
    reorder_tail_ns,
    token_group_ns,
    traffic,
)
from ubep.tuning.params import CM384_AIVS, H200_SMS, CostParams, cm384_ascend, h200
from ubep.tuning.split import BspTime, Split, best_count, best_split, bsp_time

__all__ = [
    "CM384_AIVS", "H200_SMS", "UNIEP_BUCKET_TOKENS", "BspTime", "Calibration", "CostParams",
    "DispatchShape", "Sample", "Split", "SplitCache", "Traffic", "best_count", "best_split",
    "bsp_time", "calibrate", "cm384_ascend", "count_group_ns", "h200", "per_copy_ns", "predict",
    "reorder_tail_ns", "token_group_ns", "traffic",
]
