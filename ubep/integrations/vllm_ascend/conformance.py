"""What ``core.py``, ``comm_method.py`` and ``plugin.py`` take from vllm-ascend, checked against its
source with ``ast`` (vllm-ascend imports only with torch_npu and an NPU, so it is never imported).

:func:`check_source` returns one line per mismatch, empty where every class, method (parameter names in
order), dataclass field, enum member, module name and keyword call used here exists as used, where the
graph compilers still run the FX graph's ops eagerly into an ACL graph (so the ops need no Ascend IR
converter, docs/ASCEND.md "Graphs in vLLM-Ascend"); and where
each method that ``comm_method.py`` overrides keeps vllm-ascend's parameter list. :func:`find_source`
locates the source: ``$UBEP_VLLM_ASCEND_SRC`` (an unpacked sdist, a checkout, or the ``vllm_ascend``
package directory itself), else an installed vllm-ascend (located, not imported).
:func:`check_vllm_source` does the same for the few vLLM names used (``$UBEP_VLLM_SRC``).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ubep.integrations.source_ast import (
    ParsedPackage,
    class_def,
    function_def,
    installed_package_dir,
    methods,
    params,
)

VERSION = "0.23.0.post1"
VLLM_VERSION = "0.23.0"  # the vLLM release vllm-ascend 0.23.0.post1 pins (its Dockerfile's VLLM_TAG)
ENV_SRC, ENV_VLLM_SRC = "UBEP_VLLM_ASCEND_SRC", "UBEP_VLLM_SRC"

TOKEN_DISPATCHER = "ops/fused_moe/token_dispatcher.py"
CONTRACTS = "ops/fused_moe/moe_stage_contracts.py"
PARAMS = "ops/fused_moe/moe_stage_params.py"
RUNTIME_ARGS = "ops/fused_moe/moe_runtime_args.py"
COMM_METHOD = "ops/fused_moe/moe_comm_method.py"
PREPARE_FINALIZE = "ops/fused_moe/prepare_finalize.py"
FUSED_MOE = "ops/fused_moe/fused_moe.py"
FUSED_MOE_0_23 = "ops/fused_moe/fused_moe_0_23_0.py"
FORWARD_CONTEXT = "ascend_forward_context.py"
PARALLEL_STATE = "distributed/parallel_state.py"
ASCEND_CONFIG = "ascend_config.py"
COMPILER_INTERFACE = "compilation/compiler_interface.py"
QUANT_TYPE = "quantization/quant_type.py"
RUNNER_V1 = "worker/model_runner_v1.py"
RUNNER_V2 = "worker/v2/model_runner.py"

HERE = Path(__file__).parent

PREPARE = ("self", "hidden_states", "router_logits", "enable_shared_expert_dp", "replace_allreduce",
           "quant_type")
FINALIZE = ("self", "hidden_states", "reduce_results", "padded_hidden_states_shape")


@dataclass(frozen=True)
class Signature:
    """``qualname`` (``"Class.method"`` or ``"function"``) in ``file`` takes exactly ``params``."""

    file: str
    qualname: str
    params: tuple[str, ...]


@dataclass(frozen=True)
class Fields:
    """Dataclass ``cls`` in ``file`` has the fields ``names`` in this order (``prefix``: as its first
    fields, others may follow; else these among its fields)."""

    file: str
    cls: str
    names: tuple[str, ...]
    prefix: bool = True


@dataclass(frozen=True)
class Names:
    """``file`` defines, imports or assigns each of ``names`` at module level, or, with ``cls``, in
    that class (members, methods, ``self.x =`` assignments, string constants of its attributes)."""

    file: str
    names: tuple[str, ...]
    cls: str | None = None


@dataclass(frozen=True)
class KeywordCall:
    """Inside ``qualname`` of ``file``, a call of ``.callee(...)`` passes exactly ``keywords``."""

    file: str
    qualname: str
    callee: str
    keywords: tuple[str, ...]


@dataclass(frozen=True)
class Constants:
    """Inside ``qualname`` of ``file``, each of ``values`` is a string constant (an option's name or
    value)."""

    file: str
    qualname: str
    values: tuple[str, ...]


CONTRACT = [
    # the token dispatcher (core.UbepTokenDispatcherCore, comm_method.UbepTokenDispatcher)
    Signature(TOKEN_DISPATCHER, "MoETokenDispatcher.__init__", ("self", "**kwargs")),
    Signature(TOKEN_DISPATCHER, "MoETokenDispatcher.token_dispatch", ("self", "token_dispatch_input")),
    Signature(TOKEN_DISPATCHER, "MoETokenDispatcher.token_combine",
              ("self", "hidden_states", "combine_metadata", "bias")),
    Names(TOKEN_DISPATCHER, ("get_hccl_comm_name",), cls="TokenDispatcherWithMC2"),  # how MC2 names its group
    Fields(CONTRACTS, "MoETokenDispatchInput",
           ("hidden_states", "topk_weights", "topk_ids", "routing", "quant")),
    Fields(CONTRACTS, "MoETokenDispatchOutput", ("hidden_states", "group_list", "group_list_type",
                                                 "combine_metadata", "dynamic_scale", "topk_scales")),
    Fields(CONTRACTS, "MoEFusedExpertsInput", ("routing", "dynamic_eplb"), prefix=False),
    Fields(PARAMS, "MoERoutingParams", ("expert_map", "global_redundant_expert_num", "mc2_mask",
                                        "apply_router_weight_on_input", "log2phy", "pertoken_scale")),
    Names(PARAMS, ("dispatch_with_quant",), cls="MoEQuantParams"),
    Names(RUNTIME_ARGS, ("MoETokenDispatchInput", "MoETokenDispatchOutput")),
    # the comm method (comm_method.UbepCommImpl) and the functions plugin.py patches
    Signature(COMM_METHOD, "MoECommMethod.__init__", ("self", "moe_config")),
    Signature(COMM_METHOD, "MoECommMethod.prepare", PREPARE),
    Signature(COMM_METHOD, "MoECommMethod.finalize", FINALIZE),
    Signature(COMM_METHOD, "MoECommMethod.fused_experts", ("self", "fused_experts_input")),
    Signature(COMM_METHOD, "MoECommMethod._get_token_dispatcher", ("self",)),
    Signature(COMM_METHOD, "MoECommMethod._get_prepare_finalize", ("self",)),
    Names(COMM_METHOD, ("token_dispatcher", "prepare_finalize", "moe_config"), cls="MoECommMethod"),
    KeywordCall(COMM_METHOD, "MoECommMethod.fused_experts", "token_dispatch", ("token_dispatch_input",)),
    KeywordCall(COMM_METHOD, "MoECommMethod.fused_experts", "token_combine",
                ("hidden_states", "combine_metadata")),
    Signature(COMM_METHOD, "setup_moe_comm_method", ("moe_config",)),
    Signature(COMM_METHOD, "get_moe_comm_method", ("moe_comm_type",)),
    Names(COMM_METHOD, ("_MoECommMethods", "MoECommType")),
    # the prepare/finalize (comm_method.UbepPrepareAndFinalize)
    Signature(PREPARE_FINALIZE, "PrepareAndFinalize.__init__", ("self", "moe_config")),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalize.prepare", PREPARE),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalize.finalize", FINALIZE),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalizeWithAll2All.prepare", PREPARE),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalizeWithAll2All.pad_and_split_input_ids",
              ("self", "input_ids")),
    Names(PREPARE_FINALIZE, ("num_tokens",), cls="PrepareAndFinalizeWithAll2All"),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalizeWithMC2.prepare", PREPARE),
    Signature(PREPARE_FINALIZE, "PrepareAndFinalizeWithMC2.pad_and_split_input_ids", ("self", "input_ids")),
    # the comm type, the selection, the forward context
    Names(FORWARD_CONTEXT, ("ALLGATHER", "MC2", "ALLTOALL", "FUSED_MC2"), cls="MoECommType"),
    Signature(FORWARD_CONTEXT, "select_moe_comm_method", ("num_tokens", "vllm_config", "is_draft_model")),
    Signature(FORWARD_CONTEXT, "get_mc2_tokens_capacity", ()),
    Names(FORWARD_CONTEXT, ("_EXTRA_CTX",)),
    Names(FORWARD_CONTEXT, ("padded_num_tokens", "mc2_mask"), cls="_ExtraForwardContextProxy"),
    Names(PARALLEL_STATE, ("get_mc2_group",)),
    Names(ASCEND_CONFIG, ("enable_shared_expert_dp",), cls="AscendConfig"),
    Names(ASCEND_CONFIG, ("dynamic_eplb", "expert_map_path"), cls="EplbConfig"),
    Names(QUANT_TYPE, ("NONE",), cls="QuantType"),
    # graphs: torchair's aclgraph mode and npugraph_ex's eager FX run, no Ascend IR conversion
    Constants(COMPILER_INTERFACE, "_configure_backend", ("reduce-overhead", "force_eager")),
    # the modules that import a patched function by name (plugin.IMPORTERS)
    Names(RUNNER_V1, ("select_moe_comm_method",)),
    Names(RUNNER_V2, ("select_moe_comm_method",)),
    Names(FUSED_MOE, ("setup_moe_comm_method",)),
    Names(FUSED_MOE_0_23, ("setup_moe_comm_method",)),
]

VLLM_CONTRACT = [
    Names("plugins/__init__.py", ("DEFAULT_PLUGINS_GROUP", "load_general_plugins")),
    Names("config/__init__.py", ("get_current_vllm_config",)),
    Fields("config/vllm.py", "VllmConfig", ("additional_config",), prefix=False),
    Names("distributed/parallel_state.py", ("get_tensor_model_parallel_world_size",
                                            "get_tensor_model_parallel_rank", "get_ep_group")),
]
OVERRIDES = {  # (our file, our class) -> (file, vllm-ascend class) whose methods it implements
    ("core.py", "UbepTokenDispatcherCore"): (TOKEN_DISPATCHER, "MoETokenDispatcher"),
    ("comm_method.py", "UbepTokenDispatcher"): (TOKEN_DISPATCHER, "MoETokenDispatcher"),
    ("comm_method.py", "UbepPrepareAndFinalize"): (PREPARE_FINALIZE, "PrepareAndFinalize"),
    ("comm_method.py", "UbepCommImpl"): (COMM_METHOD, "MoECommMethod"),
}


def find_source(env: Mapping[str, str] = os.environ) -> Path | None:
    """The ``vllm_ascend`` package directory to check, or ``None``."""
    return _package_dir(env.get(ENV_SRC), "vllm_ascend")


def find_vllm_source(env: Mapping[str, str] = os.environ) -> Path | None:
    return _package_dir(env.get(ENV_VLLM_SRC), "vllm")


def _package_dir(given: str | None, package: str) -> Path | None:
    if given:
        root = Path(given)
        return root / package if (root / package / "__init__.py").exists() else root
    return installed_package_dir(package)


def check_source(package: Path, ours: Path = HERE) -> list[str]:
    """Every mismatch between vllm-ascend's source at ``package`` and what ubep (the modules in
    ``ours``) uses, one line each."""
    source = ParsedPackage(package)
    return _check(source, CONTRACT) + _check_overrides(source, ParsedPackage(ours))


def check_vllm_source(package: Path) -> list[str]:
    return _check(ParsedPackage(package), VLLM_CONTRACT)


def _check(source: ParsedPackage, contract: list) -> list[str]:
    problems = []
    for item in contract:
        tree = source.tree(item.file)
        if tree is None:
            problems.append(f"{item.file}: missing")
            continue
        problem = CHECKS[type(item)](tree, item)
        if problem:
            problems.append(f"{item.file}: {problem}")
    return problems


def _check_signature(tree: ast.Module, item: Signature) -> str | None:
    fn = function_def(tree, item.qualname)
    if fn is None:
        return f"no {item.qualname}"
    got = params(fn)
    if got == item.params:
        return None
    return f"{item.qualname}{_show(got)}, expected {item.qualname}{_show(item.params)}"


def _check_fields(tree: ast.Module, item: Fields) -> str | None:
    cls = class_def(tree, item.cls)
    if cls is None:
        return f"no class {item.cls}"
    got = tuple(fields_of(cls))
    ok = got[: len(item.names)] == item.names if item.prefix else all(name in got for name in item.names)
    first = " first" * item.prefix
    return None if ok else f"{item.cls} has fields {list(got)}, expected {list(item.names)}{first}"


def _check_names(tree: ast.Module, item: Names) -> str | None:
    if item.cls is None:
        have, where = module_names(tree), "module"
    else:
        cls = class_def(tree, item.cls)
        if cls is None:
            return f"no class {item.cls}"
        have, where = class_names(cls), f"class {item.cls}"
    missing = [name for name in item.names if name not in have]
    return f"{where} has no {', '.join(missing)}" if missing else None


def _check_keyword_call(tree: ast.Module, item: KeywordCall) -> str | None:
    fn = function_def(tree, item.qualname)
    if fn is None:
        return f"no {item.qualname}"
    calls = [node for node in ast.walk(fn) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == item.callee]
    if not calls:
        return f"{item.qualname} calls no .{item.callee}(...)"
    got = [tuple(k.arg for k in call.keywords) for call in calls]
    if all(keywords == item.keywords for keywords in got) and all(not call.args for call in calls):
        return None
    return f"{item.qualname} calls .{item.callee} with keywords {got}, expected {list(item.keywords)} only"


def _check_constants(tree: ast.Module, item: Constants) -> str | None:
    fn = function_def(tree, item.qualname)
    if fn is None:
        return f"no {item.qualname}"
    found = {node.value for node in ast.walk(fn)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    missing = [v for v in item.values if v not in found]
    return f"{item.qualname} no longer mentions {missing}" if missing else None


CHECKS = {Signature: _check_signature, Fields: _check_fields, Names: _check_names,
          KeywordCall: _check_keyword_call, Constants: _check_constants}


def _check_overrides(source: ParsedPackage, ours: ParsedPackage) -> list[str]:
    """Each method of our classes that vllm-ascend's class defines keeps its parameter names in order."""
    problems = []
    for (our_file, our_name), (file, base_name) in OVERRIDES.items():
        tree, our_tree = source.tree(file), ours.tree(our_file)
        ours_cls = class_def(our_tree, our_name) if our_tree is not None else None
        base = class_def(tree, base_name) if tree is not None else None
        if ours_cls is None or base is None:
            problems.append(f"{file}: cannot compare {our_name} with {base_name} (one is missing)")
            continue
        for fn in methods(ours_cls).values():
            if fn.name == "__init__":
                continue  # our constructors take what we pass; the base's is checked in CONTRACT
            theirs = methods(base).get(fn.name)
            if theirs is not None and params(fn) != params(theirs):
                problems.append(f"{file}: {our_name}.{fn.name}{_show(params(fn))} overrides "
                                f"{base_name}.{fn.name}{_show(params(theirs))}")
    return problems


# -- ast helpers -------------------------------------------------------------------------------------


def _show(names: tuple[str, ...]) -> str:
    return f"({', '.join(names)})"


def fields_of(cls: ast.ClassDef) -> list[str]:
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def class_names(cls: ast.ClassDef) -> set[str]:
    """Members, methods and properties, ``self.x`` assignments anywhere in the class, the keys of a
    ``_defaults`` dict and the strings of tuple attributes (``extra_attrs``)."""
    names = set(fields_of(cls))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            if isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
            elif isinstance(node.value, ast.Tuple):
                names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names.add(node.func.attr)  # methods called inside (e.g. get_hccl_comm_name)
    return names
