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
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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
    trees: dict[str, ast.Module] = {}
    problems: list[str] = []

    def tree(file: str) -> ast.Module | None:
        if file not in trees:
            path = vllm_dir / file
            trees[file] = ast.parse(path.read_text()) if path.is_file() else None
            if trees[file] is None:
                problems.append(f"{file}: missing")
        return trees[file]

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
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations)))
    return found if (found / MK).is_file() else None


# -- the checks ------------------------------------------------------------------------------------


def _check_methods(ours: ast.Module, mk: ast.Module | None) -> list[str]:
    """Our class subclasses vLLM's base, defines each of its chain's abstract methods, and each
    method it overrides has vLLM's parameter names in vLLM's order (properties as properties)."""
    mine = _class(ours, OUR_CLASS)
    if mk is None or mine is None:
        return [] if mine else [f"{OURS.name}: no class {OUR_CLASS}"]
    if not any(_dotted(base).endswith(VLLM_BASE) for base in mine.bases):
        return [f"{OUR_CLASS} does not subclass {VLLM_BASE}"]
    chain = _chain(mk, VLLM_BASE)
    if not chain:
        return [f"{MK}: no class {VLLM_BASE}"]
    theirs = {name: fn for cls in reversed(chain) for name, fn in _methods(cls).items()}
    ours_by_name = _methods(mine)
    problems = [f"{MK}: {name} is abstract in vLLM, not defined by {OUR_CLASS}"
                for name, fn in theirs.items() if _is_abstract(fn) and name not in ours_by_name]
    for name, fn in ours_by_name.items():
        if name == "__init__":
            continue
        if name not in theirs:
            problems.append(f"{MK}: {OUR_CLASS}.{name} overrides nothing in {VLLM_BASE}'s chain")
        elif _params(fn) != _params(theirs[name]):
            problems.append(f"{MK}: {name}{_params(theirs[name])} in vLLM, {name}{_params(fn)} in ours")
        elif _is_property(fn) != _is_property(theirs[name]):
            problems.append(f"{MK}: {name} is {'not ' * (not _is_property(theirs[name]))}a property in vLLM")
    return problems


def _check_factory(module: ast.Module | None) -> list[str]:
    fn = _function(module, FACTORY) if module else None
    if module is None:
        return []
    if fn is None:
        return [f"{FACTORY_FILE}: no function {FACTORY}"]
    params = _params(fn)
    return [] if params == FACTORY_PARAMS else [f"{FACTORY_FILE}: {FACTORY}{params}, ours was written "
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


def _class(module: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _chain(module: ast.Module, name: str) -> list[ast.ClassDef]:
    """``name`` and its bases defined in ``module``, most derived first."""
    chain, cls = [], _class(module, name)
    while cls is not None:
        chain.append(cls)
        cls = next((c for b in cls.bases if (c := _class(module, _dotted(b).split(".")[-1]))), None)
    return chain


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _params(fn: ast.FunctionDef) -> tuple[str, ...]:
    args = fn.args
    return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _decorators(fn: ast.FunctionDef) -> set[str]:
    return {_dotted(d).split(".")[-1] for d in fn.decorator_list}


def _is_abstract(fn: ast.FunctionDef) -> bool:
    return "abstractmethod" in _decorators(fn)


def _is_property(fn: ast.FunctionDef) -> bool:
    return "property" in _decorators(fn)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return node.id if isinstance(node, ast.Name) else ""


def _has(module: ast.Module, dotted: str) -> bool:
    head, _, member = dotted.partition(".")
    if not member:
        return _function(module, head) is not None or head in _assigned(module.body) or \
            _class(module, head) is not None
    cls = _class(module, head)
    return cls is not None and (member in _methods(cls) or member in _assigned(cls.body)
                                or member in _self_assigned(cls))


def _assigned(body: list[ast.stmt]) -> set[str]:
    names = set()
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _self_assigned(cls: ast.ClassDef) -> set[str]:
    return {t.attr for fn in _methods(cls).values() for node in ast.walk(fn)
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
