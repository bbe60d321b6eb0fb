"""The vLLM general plugin (entry point ``vllm.general_plugins``: ``ubep_vllm_ascend``) that makes ubep
vllm-ascend's MoE communication, without editing vllm-ascend.

vllm-ascend 0.23.0.post1 has no registry of MoE comm methods: an enum (``MoECommType``), a function
that builds one instance of each per layer into a dict (``setup_moe_comm_method``) and one that picks
the forward's (``select_moe_comm_method``). :func:`register` patches them at run time:

- ``MoECommType`` gains a member ``UBEP``;
- ``setup_moe_comm_method(moe_config)`` builds vllm-ascend's methods, then, where ubep is requested and
  expert parallelism is on (``moe_config.ep_size > 1``), ubep's
  (:class:`~ubep.integrations.vllm_ascend.comm_method.UbepCommImpl`) under ``UBEP``;
- ``select_moe_comm_method(num_tokens, vllm_config, is_draft_model)`` returns ``UBEP`` where ubep is
  requested and its comm method was built, else what vllm-ascend chose.

Requested means ``additional_config={"moe_comm": "ubep"}`` (or, where additional_config names no
``moe_comm``, ``UBEP_VLLM_MOE_COMM=ubep``), read when the functions run, since plugins load before
vLLM's configuration exists. Elsewhere the patched functions do what vllm-ascend's do.

Nothing of vllm-ascend is imported here: a finder on ``sys.meta_path`` patches each module as its
import finishes (one already imported is patched at once), and modules that imported a patched function
by name get the patched one. Patching twice changes nothing. Where vllm-ascend is absent the plugin
logs why and does nothing.
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import ModuleType

from ubep.integrations import after_import
from ubep.integrations.vllm_ascend.core import requested

LOG = logging.getLogger("vllm.ubep")

PACKAGE = "vllm_ascend"
SUPPORTED_VERSION = "0.23.0.post1"
FORWARD_CONTEXT = "vllm_ascend.ascend_forward_context"
COMM_METHOD = "vllm_ascend.ops.fused_moe.moe_comm_method"
ENUM, REGISTRY = "MoECommType", "_MoECommMethods"
SELECT, SETUP = "select_moe_comm_method", "setup_moe_comm_method"
COMM_TYPE, COMM_TYPE_VALUE = "UBEP", "ubep"  # a str value: no future int member of vllm-ascend's can clash
IMPORTERS = {  # modules that import a patched function by name (vllm-ascend 0.23.0.post1)
    SELECT: ("vllm_ascend.worker.model_runner_v1", "vllm_ascend.worker.v2.model_runner"),
    SETUP: ("vllm_ascend.ops.fused_moe.fused_moe", "vllm_ascend.ops.fused_moe.fused_moe_0_23_0"),
}
ORIGINAL = "__ubep_original__"  # on a patched function: the one it wraps


def register() -> None:
    """The entry point: patch vllm-ascend where it is installed, else log why nothing happens."""
    if importlib.util.find_spec(PACKAGE) is None:
        LOG.info("ubep: vllm-ascend is not installed (no module %s); the ubep MoE comm plugin does nothing",
                 PACKAGE)
        return
    _check_version()
    DEFAULT.install()


def _check_version() -> None:
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return
    if version != SUPPORTED_VERSION:
        LOG.warning("ubep: written for vllm-ascend %s, found %s; if a name it patches moved, ubep stays "
                    "off with a warning (tests/test_integration_vllm_ascend.py checks a release's source)",
                    SUPPORTED_VERSION, version)


def add_comm_type(enum_cls: type[enum.Enum]) -> enum.Enum:
    """``enum_cls.UBEP``, added to the enum the first time (iteration, ``enum_cls["UBEP"]`` and
    ``enum_cls("ubep")`` see it like the others)."""
    found = enum_cls.__members__.get(COMM_TYPE)
    if found is not None:
        return found
    member = object.__new__(enum_cls)
    member._name_, member._value_ = COMM_TYPE, COMM_TYPE_VALUE
    member._sort_order_ = len(enum_cls._member_names_)
    type.__setattr__(enum_cls, COMM_TYPE, member)
    enum_cls._member_map_[COMM_TYPE] = member
    enum_cls._member_names_.append(COMM_TYPE)
    enum_cls._value2member_map_[COMM_TYPE_VALUE] = member
    return member


def _additional_config(vllm_config: object) -> object:
    return getattr(vllm_config, "additional_config", None)


def _current_vllm_config() -> object:
    from vllm.config import get_current_vllm_config

    return get_current_vllm_config()


def _ubep_comm_method(moe_config: object) -> object:
    from ubep.integrations.vllm_ascend.comm_method import UbepCommImpl

    return UbepCommImpl(moe_config)


@dataclass
class Patcher:
    """The patches, with what they reach outside injectable (the tests pass fakes): ``modules`` (where
    modules are found by name), ``current_config`` (vLLM's configuration while layers are built),
    ``make_comm_method`` (ubep's comm method for a ``moe_config``) and ``env``."""

    modules: MutableMapping[str, ModuleType] = field(default_factory=lambda: sys.modules)
    current_config: Callable[[], object] = _current_vllm_config
    make_comm_method: Callable[[object], object] = _ubep_comm_method
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    # -- the two modules -------------------------------------------------------------------------

    def patch_forward_context(self, module: ModuleType) -> None:
        """``MoECommType.UBEP`` and the selection."""
        ubep_type = add_comm_type(getattr(module, ENUM))
        self._replace(module, SELECT, lambda original: self._selecting(original, ubep_type))

    def patch_comm_method(self, module: ModuleType) -> None:
        """``MoECommType.UBEP`` and the set-up of the comm methods."""
        ubep_type = add_comm_type(getattr(module, ENUM))
        self._replace(module, SETUP, lambda original: self._setting_up(original, module, ubep_type))

    def _replace(self, module: ModuleType, name: str, wrap: Callable[[Callable], Callable]) -> None:
        original = getattr(module, name)
        if hasattr(original, ORIGINAL):
            return
        patched = wrap(original)
        setattr(patched, ORIGINAL, original)
        setattr(module, name, patched)
        for importer in IMPORTERS[name]:
            self.rebind(importer, name)
        LOG.debug("ubep: patched %s.%s", module.__name__, name)

    def rebind(self, importer: str, name: str) -> None:
        """Where module ``importer`` (if loaded) holds vllm-ascend's ``name``, give it the patched one."""
        module = self.modules.get(importer)
        defining = self.modules.get(FORWARD_CONTEXT if name == SELECT else COMM_METHOD)
        held = getattr(module, name, None) if module is not None else None
        patched = getattr(defining, name, None) if defining is not None else None
        if held is not None and patched is not None and getattr(patched, ORIGINAL, None) is held:
            setattr(module, name, patched)

    # -- the patched functions -----------------------------------------------------------------------

    def _selecting(self, original: Callable, ubep_type: enum.Enum) -> Callable:
        @functools.wraps(original)
        def select_moe_comm_method(num_tokens, vllm_config, is_draft_model=False):
            chosen = original(num_tokens, vllm_config, is_draft_model)
            if chosen is None or not requested(_additional_config(vllm_config), self.env):
                return chosen
            registry = getattr(self.modules.get(COMM_METHOD), REGISTRY, {})
            return ubep_type if ubep_type in registry else chosen

        return select_moe_comm_method

    def _setting_up(self, original: Callable, module: ModuleType, ubep_type: enum.Enum) -> Callable:
        @functools.wraps(original)
        def setup_moe_comm_method(moe_config):
            original(moe_config)
            if not requested(_additional_config(self.current_config()), self.env):
                return
            if moe_config.ep_size <= 1:
                LOG.info("ubep: requested, but expert parallelism is off (EP size %d): vllm-ascend keeps its "
                         "own MoE communication", moe_config.ep_size)
                return
            getattr(module, REGISTRY)[ubep_type] = self.make_comm_method(moe_config)

        return setup_moe_comm_method

    # -- when -------------------------------------------------------------------------------------------

    def patches(self) -> dict[str, Callable[[ModuleType], None]]:
        """What to do to each module, by name, once it is imported."""
        table: dict[str, Callable[[ModuleType], None]] = {FORWARD_CONTEXT: self.patch_forward_context,
                                                          COMM_METHOD: self.patch_comm_method}
        for name, importers in IMPORTERS.items():
            for importer in importers:
                table[importer] = functools.partial(lambda n, i, _module: self.rebind(i, n), name, importer)
        return table

    def install(self, meta_path: list | None = None) -> None:
        """Patch the modules already imported, and the others as their import finishes."""
        for name, patch in self.patches().items():
            after_import.when_imported(name, _guarded(name, patch), modules=self.modules, meta_path=meta_path)


def _guarded(name: str, patch: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """``patch`` that logs instead of raising: a renamed function in a later vllm-ascend must not break
    its import; ubep then stays off."""

    def run(module: ModuleType) -> None:
        try:
            patch(module)
        except Exception as err:  # AttributeError from a renamed function, or anything else
            LOG.warning("ubep: cannot patch %s (%s: %s); moe_comm=ubep will have no effect", name,
                        type(err).__name__, err)

    return run


DEFAULT = Patcher()
