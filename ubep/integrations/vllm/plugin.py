"""The vLLM general plugin (entry point ``vllm.general_plugins``: ``ubep_vllm``): with ``UBEP_VLLM``
set, vLLM's all2all MoE layers get ubep's prepare/finalize, with no edit of vLLM's files.

vLLM 0.23.0 has no registry of all2all backends (its ``--all2all-backend`` is a closed ``Literal``
and its factory an ``if/elif`` chain), so :func:`register` patches, at run time, once per process:

- ``fused_moe.all2all_utils.maybe_make_prepare_finalize``, the factory of prepare/finalize objects:
  where vLLM would run all2all kernels (data parallel > 1 with expert parallelism) it returns
  :class:`~ubep.integrations.vllm.modular.UbepPrepareAndFinalize`; elsewhere it calls vLLM's own;
- ``FusedMoEParallelConfig.use_batched_activation_format``: true on those layers, so vLLM's kernel
  oracle picks batched experts (the format ubep's padded layout is);
- ``ParallelConfig.use_batched_dp_moe``: true likewise, so ``--max-num-batched-tokens`` defaults to
  vLLM's batched-DP value (256) as for DeepEP low-latency: ubep's padded Buffer holds
  ``W * max_tokens`` rows per local expert.

A module not imported yet is patched as its import finishes (a finder on ``sys.meta_path``), so no
vLLM module is imported early; one already imported is patched at once, and modules that had
imported the factory by name get the patched one. Patching twice changes nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from types import ModuleType

from ubep.integrations import after_import
from ubep.integrations.vllm.core import ENV, Settings

LOG = logging.getLogger("vllm.ubep")

FACTORY_MODULE = "vllm.model_executor.layers.fused_moe.all2all_utils"
FACTORY = "maybe_make_prepare_finalize"
MOE_CONFIG_MODULE = "vllm.model_executor.layers.fused_moe.config"
PARALLEL_CONFIG_MODULE = "vllm.config.parallel"
ORIGINAL = "__ubep_original__"  # on a patched function: what it replaced

Builder = Callable[..., object]  # (moe, routing_tables, settings) -> a prepare/finalize


class _State:
    settings: Settings | None = None
    undo: list[Callable[[], None]] = []


def register() -> None:
    """vLLM's plugin entry point, called in every vLLM process. Off (nothing patched) unless
    ``UBEP_VLLM`` is set; a no-op with a log line where vLLM cannot be imported."""
    settings = Settings.from_env()
    if importlib.util.find_spec("vllm") is None:
        LOG.info("ubep: vLLM is not importable here; nothing patched")
        return
    if not settings.enabled:
        LOG.debug("ubep: %s is not set; vLLM's own all2all backends stay", ENV)
        return
    install(settings, _build_with_vllm)


def install(settings: Settings, builder: Builder) -> bool:
    """Patch vLLM (now, or as each module is imported) so that all2all layers get ``builder``'s
    prepare/finalize. Returns False, changing nothing, where it already ran in this process."""
    if _State.settings is not None:
        return False
    _State.settings = settings
    after_import.when_imported(FACTORY_MODULE, functools.partial(patch_factory, settings=settings,
                                                                 builder=builder))
    after_import.when_imported(MOE_CONFIG_MODULE, patch_moe_parallel_config)
    after_import.when_imported(PARALLEL_CONFIG_MODULE, patch_parallel_config)
    LOG.info("ubep: vLLM MoE all2all through ubep (%s=%s): %s; on layers with data parallel > 1 "
             "and --enable-expert-parallel", ENV, settings.backend, settings.describe())
    return True


def uninstall() -> None:
    """Undo :func:`install` (for tests): originals back, pending patches dropped."""
    while _State.undo:
        _State.undo.pop()()
    after_import.remove()
    _State.settings = None


def _build_with_vllm(moe, routing_tables, settings: Settings):
    from ubep.integrations.vllm.modular import make_prepare_finalize

    return make_prepare_finalize(moe, routing_tables, settings)


# -- the patches -----------------------------------------------------------------------------------


def patch_factory(module: ModuleType, *, settings: Settings, builder: Builder) -> None:
    """Put the ubep factory in place of ``module.maybe_make_prepare_finalize`` and of every
    reference to it that another module took with ``from ... import``."""
    original = getattr(module, FACTORY)
    if hasattr(original, ORIGINAL):
        return
    patched = ubep_factory(original, settings, builder)
    holders = [m for m in list(sys.modules.values()) if _holds(m, original)]
    for holder in holders:
        setattr(holder, FACTORY, patched)
    _State.undo.append(lambda: [setattr(holder, FACTORY, original) for holder in holders])


def _holds(module: object, function: object) -> bool:
    return isinstance(module, ModuleType) and vars(module).get(FACTORY) is function


def ubep_factory(original: Callable, settings: Settings, builder: Builder) -> Callable:
    """``original`` (vLLM's factory), but for a layer that runs all2all kernels: ubep's. Its
    arguments are read by name, as vLLM's signature binds them."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def maybe_make_prepare_finalize(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        moe = given["moe"]
        if not moe.moe_parallel_config.use_all2all_kernels:
            return original(*args, **kwargs)
        if given.get("use_monolithic"):
            raise ValueError("ubep offers a modular prepare/finalize; this layer's experts are monolithic "
                             f"(they route inside): unset {ENV} or pick another MoE backend")
        if given.get("eep_stage"):
            raise ValueError(f"ubep does not support elastic expert parallelism: unset {ENV}")
        return builder(moe, given.get("routing_tables"), settings)

    setattr(maybe_make_prepare_finalize, ORIGINAL, original)
    return maybe_make_prepare_finalize


def patch_moe_parallel_config(module: ModuleType) -> None:
    """All2all layers use the BatchedExperts format (the experts the oracle picks)."""
    _or_property(module.FusedMoEParallelConfig, "use_batched_activation_format",
                 lambda config: config.use_all2all_kernels)


def patch_parallel_config(module: ModuleType) -> None:
    """DP + EP deployments get the batched-DP default of ``--max-num-batched-tokens``."""
    _or_property(module.ParallelConfig, "use_batched_dp_moe",
                 lambda config: config.enable_expert_parallel and config.data_parallel_size > 1)


def _or_property(cls: type, name: str, also: Callable[[object], bool]) -> None:
    """Make property ``cls.name`` true where ``also(self)`` is, else what it was."""
    original = inspect.getattr_static(cls, name)
    if hasattr(original.fget, ORIGINAL):
        return

    def fget(self) -> bool:
        return bool(also(self)) or original.fget(self)

    setattr(fget, ORIGINAL, original)
    setattr(cls, name, property(fget, doc=original.__doc__))
    _State.undo.append(lambda: setattr(cls, name, original))
