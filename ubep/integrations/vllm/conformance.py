"""What ``modular.py`` and ``plugin.py`` take from vLLM, checked against vLLM's source with ``ast``
(nothing of vLLM is imported, so its dependencies need not be installed).

:func:`check_source` returns one line per mismatch, empty where every class, method (with its
parameter names in order), property, field and function used here exists as used. It compares
``UbepPrepareAndFinalize`` (parsed from ``modular.py``) with the abstract methods and signatures of
vLLM's ``FusedMoEPrepareAndFinalizeModular`` chain, and the factory the plugin patches with the
parameter list it was written against. :func:`find_source` locates the source: ``UBEP_VLLM_SRC``
(a directory holding the ``vllm`` package, or the package itself), else an installed vLLM.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ubep.integrations.source_ast import (
    ParsedPackage,
    class_def,
    decorators,
    dotted,
    function_def,
    installed_package_dir,
    methods,
    params,
)

VLLM_VERSION = "0.23.0"  # the release vllm-ascend 0.23.0.post1 pins (.github/vllm-release-tag.commit)
ENV_SRC = "UBEP_VLLM_SRC"

MK = "model_executor/layers/fused_moe/modular_kernel.py"
WEIGHT_AND_REDUCE = "model_executor/layers/fused_moe/topk_weight_and_reduce.py"
FACTORY_FILE = "model_executor/layers/fused_moe/all2all_utils.py"
MOE_CONFIG = "model_executor/layers/fused_moe/config.py"
PARALLEL_CONFIG = "config/parallel.py"
PARALLEL_STATE = "distributed/parallel_state.py"
DISTRIBUTED = "distributed/__init__.py"
PLUGINS = "plugins/__init__.py"

OURS = Path(__file__).with_name("modular.py")
OUR_CLASS = "UbepPrepareAndFinalize"
VLLM_BASE = "FusedMoEPrepareAndFinalizeModular"
FACTORY = "maybe_make_prepare_finalize"
FACTORY_PARAMS = ("moe", "quant_config", "routing_tables", "allow_new_interface", "use_monolithic",
                  "eep_stage")
PLUGIN_GROUP = "vllm.general_plugins"


@dataclass(frozen=True)
class Member:
    """``name`` in ``file``: ``"Class"``, ``"Class.member"`` (a method, property, field or
    ``self.member =`` assignment) or a module-level ``"function"`` / ``"NAME"``."""

    file: str
    name: str


MEMBERS = [  # each with the place in modular.py / plugin.py that uses it
    Member(MK, "FusedMoEActivationFormat.BatchedExperts"),  # activation_format
    Member(MK, "ExpertTokensMetadata.expert_num_tokens"),  # prepare's metadata
    Member(MK, "ExpertTokensMetadata.expert_num_tokens_cpu"),
    Member(MK, "PrepareResultType"),
    Member(MK, "TopKWeightAndReduce"),
    Member(MK, "FusedMoEExperts.quant_config"),  # post_init_setup
    Member(MK, "FusedMoEExperts.expects_unquantized_inputs"),
    Member(WEIGHT_AND_REDUCE, "TopKWeightAndReduceDelegate"),  # finalize
    Member(MOE_CONFIG, "FusedMoEQuantConfig.quant_dtype"),  # prepare, post_init_setup
    *(Member(MOE_CONFIG, f"FusedMoEConfig.{field}") for field in  # buffer_spec, make_prepare_finalize
      ("num_experts", "experts_per_token", "hidden_dim", "num_local_experts", "in_dtype",
       "max_num_tokens", "moe_parallel_config")),
    Member(MOE_CONFIG, "FusedMoEParallelConfig.use_all2all_kernels"),  # the factory, the patch
    Member(MOE_CONFIG, "FusedMoEParallelConfig.use_batched_activation_format"),  # patched
    Member(PARALLEL_CONFIG, "ParallelConfig.use_batched_dp_moe"),  # patched
    Member(PARALLEL_CONFIG, "ParallelConfig.enable_expert_parallel"),
    Member(PARALLEL_CONFIG, "ParallelConfig.data_parallel_size"),
    Member(PARALLEL_STATE, "get_ep_group"),  # make_prepare_finalize
    Member(PARALLEL_STATE, "GroupCoordinator.device_group"),
]


def check_source(vllm_dir: Path, ours: Path = OURS) -> list[str]:
    """Every mismatch between what we use and the vLLM package source at ``vllm_dir``."""
    package = ParsedPackage(vllm_dir)
    problems: list[str] = []

    def tree(file: str) -> ast.Module | None:
        found = package.tree(file)
        if found is None and f"{file}: missing" not in problems:
            problems.append(f"{file}: missing")
        return found

    problems += _check_methods(ast.parse(ours.read_text()), tree(MK))
    problems += _check_factory(tree(FACTORY_FILE))
    problems += [f"{m.file}: no {m.name}" for m in MEMBERS if (t := tree(m.file)) and not _has(t, m.name)]
    problems += _check_reexport(tree(DISTRIBUTED), "parallel_state", "get_ep_group")
    problems += _check_plugin_group(tree(PLUGINS))
    return problems


def source_version(vllm_dir: Path) -> str | None:
    """``__version__`` of ``vllm/_version.py`` (wheels and sdists carry it), else None."""
    path = vllm_dir / "_version.py"
    found = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", path.read_text()) if path.is_file() else None
    return found.group(1) if found else None


def find_source(env: Mapping[str, str] = os.environ) -> Path | None:
    """The ``vllm`` package directory: ``UBEP_VLLM_SRC`` (``ValueError`` if it holds none), else an
    installed vLLM's (found without importing it), else None."""
    raw = env.get(ENV_SRC)
    if raw:
        for candidate in (Path(raw) / "vllm", Path(raw)):
            if (candidate / MK).is_file():
                return candidate
        raise ValueError(f"{ENV_SRC}={raw!r} holds no vllm/{MK}")
    found = installed_package_dir("vllm")
    return found if found is not None and (found / MK).is_file() else None


# -- the checks ------------------------------------------------------------------------------------


def _check_methods(ours: ast.Module, mk: ast.Module | None) -> list[str]:
    """Our class subclasses vLLM's base, defines each of its chain's abstract methods, and each
    method it overrides has vLLM's parameter names in vLLM's order (properties as properties)."""
    mine = class_def(ours, OUR_CLASS)
    if mk is None or mine is None:
        return [] if mine else [f"{OURS.name}: no class {OUR_CLASS}"]
    if not any(dotted(base).endswith(VLLM_BASE) for base in mine.bases):
        return [f"{OUR_CLASS} does not subclass {VLLM_BASE}"]
    chain = _chain(mk, VLLM_BASE)
    if not chain:
        return [f"{MK}: no class {VLLM_BASE}"]
    theirs = {name: fn for cls in reversed(chain) for name, fn in methods(cls).items()}
    ours_by_name = methods(mine)
    problems = [f"{MK}: {name} is abstract in vLLM, not defined by {OUR_CLASS}"
                for name, fn in theirs.items() if _is_abstract(fn) and name not in ours_by_name]
    for name, fn in ours_by_name.items():
        if name == "__init__":
            continue
        if name not in theirs:
            problems.append(f"{MK}: {OUR_CLASS}.{name} overrides nothing in {VLLM_BASE}'s chain")
        elif params(fn) != params(theirs[name]):
            problems.append(f"{MK}: {name}{params(theirs[name])} in vLLM, {name}{params(fn)} in ours")
        elif _is_property(fn) != _is_property(theirs[name]):
            problems.append(f"{MK}: {name} is {'not ' * (not _is_property(theirs[name]))}a property in vLLM")
    return problems


def _check_factory(module: ast.Module | None) -> list[str]:
    fn = function_def(module, FACTORY) if module else None
    if module is None:
        return []
    if fn is None:
        return [f"{FACTORY_FILE}: no function {FACTORY}"]
    found = params(fn)
    return [] if found == FACTORY_PARAMS else [f"{FACTORY_FILE}: {FACTORY}{found}, ours was written "
                                                f"against {FACTORY}{FACTORY_PARAMS}"]


def _check_reexport(module: ast.Module | None, source: str, name: str) -> list[str]:
    if module is None:
        return []
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(source) and \
                any(alias.name in ("*", name) for alias in node.names):
            return []
    return [f"{DISTRIBUTED}: does not re-export {name} from {source}"]


def _check_plugin_group(module: ast.Module | None) -> list[str]:
    if module is None:
        return []
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                node.value.value == PLUGIN_GROUP:
            return []
    return [f"{PLUGINS}: no {PLUGIN_GROUP!r} entry-point group"]


# -- ast helpers -----------------------------------------------------------------------------------


def _chain(module: ast.Module, name: str) -> list[ast.ClassDef]:
    """``name`` and its bases defined in ``module``, most derived first."""
    chain, cls = [], class_def(module, name)
    while cls is not None:
        chain.append(cls)
        cls = next((c for b in cls.bases if (c := class_def(module, dotted(b).split(".")[-1]))), None)
    return chain


def _is_abstract(fn: ast.FunctionDef) -> bool:
    return "abstractmethod" in decorators(fn)


def _is_property(fn: ast.FunctionDef) -> bool:
    return "property" in decorators(fn)


def _has(module: ast.Module, name: str) -> bool:
    head, _, member = name.partition(".")
    if not member:
        return function_def(module, head) is not None or head in _assigned(module.body) or \
            class_def(module, head) is not None
    cls = class_def(module, head)
    return cls is not None and (member in methods(cls) or member in _assigned(cls.body)
                                or member in _self_assigned(cls))


def _assigned(body: list[ast.stmt]) -> set[str]:
    names = set()
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _self_assigned(cls: ast.ClassDef) -> set[str]:
    return {t.attr for fn in methods(cls).values() for node in ast.walk(fn)
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
