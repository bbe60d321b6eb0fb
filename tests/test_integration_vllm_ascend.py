"""ubep as vllm-ascend's MoE communication (ubep/integrations/vllm_ascend/).

(a) Functional, on CPU gloo ranks: the core token dispatcher driven through the calls vllm-ascend
    makes (token_dispatch -> grouped MLP on group_list -> token_combine), both layouts in turn on one
    group, bit for bit against ubep.oracle; on the reference backend and on the ascend backend's CPU
    twin (where its library is built). Placement, input and settings checks on one rank.
(b) Conformance: the classes, signatures, fields and calls used, against vllm-ascend's source with
    ``ast`` ($UBEP_VLLM_ASCEND_SRC or an installed vllm-ascend; skipped where neither is present), and a
    renamed method in a scratch copy of that source caught.
(c) The plugin's registration on fake vllm-ascend modules: the comm type, the selection and the
    set-up, idempotent, active only under the setting; the import hook on a fake package on disk.
"""

from __future__ import annotations

import enum
import logging
import shutil
import sys
import textwrap
from types import ModuleType, SimpleNamespace

import pytest
import torch

import ubep.backends.reference
import ubep.buffer
from tests.vllm_ascend_workers import QuantParams, RoutingParams, Scenario, Step, TokenDispatchInput, flow
from ubep.backends.ascend_library import library_path
from ubep.integrations.vllm_ascend import conformance, plugin
from ubep.integrations.vllm_ascend.core import (
    ENV,
    LayerShape,
    Settings,
    UbepTokenDispatcherCore,
    finalize_rows,
    grouped_rows,
    identity_expert_map,
    requested,
    tokens_per_rank,
)
from ubep.launch import run_ranks

# -- (a) functional ------------------------------------------------------------------------------------

STEPS = (  # decode with padding tokens, prefill, decode, prefill with a rank of no tokens
    Step("padded", (5, 6), seed=1, masked=2, log2phy=True),
    Step("compact", (17, 9), seed=2),
    Step("padded", (6, 3), seed=3),
    Step("compact", (24, 0), seed=4, log2phy=True),
)
STEPS3 = (Step("compact", (11, 0, 7), seed=5), Step("padded", (4, 6, 2), seed=6, masked=1),
          Step("padded", (0, 0, 1), seed=7), Step("compact", (20, 13, 24), seed=8))


def scenarios(backend: str) -> list[tuple[int, Scenario]]:
    sync = {"ascend": "sw", "reference": None}[backend]
    return [
        (2, Scenario(hidden=32, num_experts=8, top_k=3, steps=STEPS, backend=backend, sync=sync)),
        (3, Scenario(hidden=24, num_experts=6, top_k=2, steps=STEPS3, dtype="fp32", backend=backend,
                     sync="tff" if backend == "ascend" else None, reduce="expert_rank", prefill_group=True)),
        (2, Scenario(hidden=16, num_experts=4, top_k=1, steps=STEPS[:2], dtype="fp16", backend=backend,
                     sync=sync, weight_on_input=True)),
    ]


def _run(world: int, sc: Scenario) -> None:
    results = run_ranks(flow, world, sc, timeout_s=300)
    assert results == [[]] * world, "\n".join(p for r in results for p in r)


@pytest.mark.parametrize("world, sc", scenarios("reference"), ids=["bf16-w2", "fp32-w3", "fp16-on-input"])
def test_flow_matches_oracle_reference(world, sc):
    _run(world, sc)


@pytest.mark.skipif(library_path() is None,
                    reason="the ascend operator library is not built (./build.sh test builds its CPU twin)")
@pytest.mark.parametrize("world, sc", scenarios("ascend"), ids=["bf16-w2-sw", "fp32-w3-tff", "fp16-on-input"])
def test_flow_matches_oracle_ascend_twin(world, sc):
    _run(world, sc)


def _core(group, **settings) -> UbepTokenDispatcherCore:
    return UbepTokenDispatcherCore(group, LayerShape(16, 4, 2, torch.float32), Settings(backend="reference",
                                   **settings), decode_tokens=4, prefill_tokens=8)


def _input(expert_map=None, log2phy=None, redundant=0, mask=None, on_input=False, hidden=None, top_k=2):
    x = torch.randn(3, 16) if hidden is None else hidden
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)[:, :top_k]
    routing = RoutingParams(expert_map, redundant, mask, on_input, log2phy)
    return TokenDispatchInput(x, torch.rand(3, top_k), ids, routing, QuantParams())


@pytest.mark.parametrize("change, named", [
    ({"expert_map": torch.tensor([1, 0, 2, 3], dtype=torch.int32)}, "expert_map"),
    ({"expert_map": torch.arange(5, dtype=torch.int32)}, "expert_map"),
    ({"log2phy": torch.tensor([0, 2, 1, 3], dtype=torch.int32)}, "log2phy"),
    ({"redundant": 2}, "global_redundant_expert_num"),
    ({"mask": torch.ones(2, dtype=torch.bool)}, "mc2_mask"),
    ({"hidden": torch.zeros(3, 16, dtype=torch.int8)}, "hidden_states"),
    ({"hidden": torch.zeros(3, 8)}, "hidden_states"),
])
def test_refuses_other_placements_and_inputs(single_rank_group, change, named):
    core = _core(single_rank_group)
    with pytest.raises(ValueError, match=named):
        core.token_dispatch(_input(**change))


def test_accepts_identity_placement_once_per_tensor(single_rank_group):
    core = _core(single_rank_group)
    expert_map, log2phy = torch.arange(4, dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    out = core.token_dispatch(_input(expert_map, log2phy))
    assert out.group_list.tolist() == [1, 2, 2, 1]
    assert len(core._checked) == 2
    expert_map.add_(1)  # changed in place: a new version, checked again
    with pytest.raises(ValueError, match="expert_map"):
        core.token_dispatch(_input(expert_map, log2phy))
    with pytest.raises(ValueError, match="bias"):
        core.token_combine(out.hidden_states, out.combine_metadata, bias=torch.zeros(16))


def test_graph_capture_gate(single_rank_group, monkeypatch):
    """Inside an ACL graph capture only a padded dispatch of the ascend backend may run (the compact one
    reads its size on the host, the reference backend synchronizes with it): the Buffer refuses the
    others before any communication."""
    for module in (ubep.buffer, ubep.backends.reference):
        monkeypatch.setattr(module, "graph_capturing", lambda t: True)
    core = _core(single_rank_group)
    for layout, refused in (("padded", "backend='reference' cannot be captured"),
                            ("compact", "layout='compact' cannot be captured")):
        core.choose_layout(4 if layout == "padded" else None)
        with pytest.raises(RuntimeError, match=refused):
            core.token_dispatch(_input())
    if library_path() is not None:
        ascend = UbepTokenDispatcherCore(single_rank_group, LayerShape(16, 4, 2, torch.float32),
                                         Settings(backend="ascend"), decode_tokens=4, prefill_tokens=8)
        ascend.choose_layout(4)
        assert ascend.token_dispatch(_input()).group_list.tolist() == [1, 2, 2, 1]
        ascend.choose_layout(None)
        with pytest.raises(RuntimeError, match="layout='compact' cannot be captured"):
            ascend.token_dispatch(_input())
        ascend.destroy()


def test_weight_on_input_needs_top_1(single_rank_group):
    with pytest.raises(ValueError, match="apply_router_weight_on_input"):
        _core(single_rank_group).token_dispatch(_input(on_input=True))


def test_layout_choice(single_rank_group):
    core = _core(single_rank_group)
    assert [core.choose_layout(t) for t in (0, 4, 5, None)] == ["padded", "padded", "compact", "compact"]
    assert "padded (decode, <= 4 tokens/rank) + compact (prefill, <= 8 tokens/rank)" in core.describe()
    only = UbepTokenDispatcherCore(single_rank_group, LayerShape(16, 4, 2, torch.float32),
                                   Settings(backend="reference"), decode_tokens=0, prefill_tokens=8)
    assert only.choose_layout(1) == "compact"
    assert "compact (prefill, <= 8 tokens/rank) only" in only.describe()


def test_grouped_rows_against_a_loop():
    counts, cap, rows = torch.tensor([2, 0, 3]), 4, 9
    rows_R, back_P = grouped_rows(counts, cap, rows)
    want = [j * cap + o for j, n in enumerate(counts.tolist()) for o in range(n)]
    assert rows_R[: len(want)].tolist() == want and rows_R.shape == (rows,)
    assert all(0 <= r < 3 * cap for r in rows_R.tolist())
    grouped = {padded: g for g, padded in enumerate(want)}
    assert back_P.tolist() == [grouped.get(p, 0) for p in range(3 * cap)]


def test_finalize_rows_and_token_bounds():
    rows = torch.arange(6.0).view(3, 2)
    whole = finalize_rows(rows, num_tokens=2, padded_shape=None, tp_size=1, tp_rank=0, split=True)
    assert whole.tolist() == [[0, 1], [2, 3]]
    assert finalize_rows(rows, num_tokens=1, padded_shape=None, tp_size=4, tp_rank=3, split=False) is rows
    partial = finalize_rows(rows, num_tokens=5, padded_shape=(6, 2), tp_size=2, tp_rank=1, split=True)
    assert partial.tolist() == [[0, 0]] * 3 + [[0, 1], [2, 3]]  # rank 1's slice; zeros for the TP sum
    assert (tokens_per_rank(8, 2, True), tokens_per_rank(8, 2, False), tokens_per_rank(None, 2, True)) == \
        (4, 8, None)
    assert identity_expert_map(6, 3, 1).tolist() == [-1, -1, 0, 1, -1, -1]


def test_settings_and_request():
    assert Settings.from_additional_config({"moe_comm": "ubep"}) == Settings()
    assert Settings.from_additional_config({"ubep": {"sync": "tff", "decode_tokens": 0}}).decode_tokens == 0
    for bad, named in [({"ubep": {"syncc": "tff"}}, "syncc"), ({"ubep": {"backend": "cuda"}}, "backend"),
                       ({"ubep": {"decode_tokens": -1}}, "decode_tokens"), ({"ubep": {"sync": "x"}}, "sync"),
                       ({"ubep": {"prefill_tokens": 0}}, "prefill_tokens"), ({"ubep": []}, "dict")]:
        with pytest.raises(ValueError, match=named):
            Settings.from_additional_config(bad)
    assert requested({"moe_comm": "ubep"}, {}) and requested({"moe_comm": "UBEP"}, {})
    assert not requested({}, {}) and not requested(None, {})
    assert not requested({"moe_comm": "mc2"}, {ENV: "ubep"})
    assert requested({}, {ENV: "ubep"}) and requested(None, {ENV: "ubep"}) and not requested({}, {ENV: "1"})


# -- (b) conformance against vllm-ascend's source ---------------------------------------------------------

SOURCE = conformance.find_source()
NO_SOURCE = (f"vllm-ascend's source is not available: it is not installed (it cannot be on a CPU machine: "
             f"its build needs CANN and the chip type), and ${conformance.ENV_SRC} is unset (point it at an "
             f"unpacked vllm-ascend {conformance.VERSION} sdist to check it)")


@pytest.mark.skipif(SOURCE is None, reason=NO_SOURCE)
def test_vllm_ascend_source_conforms():
    assert conformance.check_source(SOURCE) == []


@pytest.mark.skipif(SOURCE is None, reason=NO_SOURCE)
def test_conformance_catches_a_renamed_method(tmp_path):
    copy = tmp_path / "vllm_ascend"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("*.so", "_cann_ops_custom", "__pycache__"))
    dispatcher = copy / conformance.TOKEN_DISPATCHER
    dispatcher.write_text(dispatcher.read_text().replace("def token_combine(", "def token_uncombine("))
    prepare = copy / conformance.PREPARE_FINALIZE
    prepare.write_text(prepare.read_text().replace("reduce_results: bool,", "reduce: bool,"))
    compiler = copy / conformance.COMPILER_INTERFACE  # graphs in Ascend IR: our ops have no converter
    compiler.write_text(compiler.read_text().replace('"reduce-overhead"', '"max-autotune"'))
    problems = conformance.check_source(copy)
    assert any("no MoETokenDispatcher.token_combine" in p for p in problems), problems
    assert any("PrepareAndFinalize.finalize(self, hidden_states, reduce," in p for p in problems), problems
    assert any("_configure_backend no longer mentions ['reduce-overhead']" in p for p in problems), problems


VLLM_SOURCE = conformance.find_vllm_source()


@pytest.mark.skipif(VLLM_SOURCE is None, reason=f"vLLM's source is not available (not installed; set "
                    f"${conformance.ENV_VLLM_SRC} to an unpacked vLLM {conformance.VLLM_VERSION} wheel)")
def test_vllm_source_conforms():
    assert conformance.check_vllm_source(VLLM_SOURCE) == []


# -- (c) the plugin's registration on fakes ----------------------------------------------------------------


class FakeCommType(enum.Enum):  # vllm-ascend's MoECommType
    ALLGATHER = 0
    MC2 = 1
    ALLTOALL = 2
    FUSED_MC2 = 3


def fake_modules(comm_type: type[enum.Enum]) -> dict[str, ModuleType]:
    """``ascend_forward_context``, ``moe_comm_method`` and one module of each kind that imported a
    patched function by name, with vllm-ascend's names and simplified bodies."""
    context = ModuleType(plugin.FORWARD_CONTEXT)
    context.MoECommType = comm_type

    def select_moe_comm_method(num_tokens, vllm_config, is_draft_model=False):
        return comm_type.MC2 if num_tokens <= 16 else comm_type.ALLTOALL

    context.select_moe_comm_method = select_moe_comm_method
    methods = ModuleType(plugin.COMM_METHOD)
    methods.MoECommType, methods._MoECommMethods = comm_type, {}

    def setup_moe_comm_method(moe_config):
        methods._MoECommMethods[comm_type.ALLGATHER] = "allgather"
        if moe_config.ep_size > 1:
            methods._MoECommMethods[comm_type.MC2] = "mc2"

    methods.setup_moe_comm_method = setup_moe_comm_method
    runner = ModuleType(plugin.IMPORTERS[plugin.SELECT][0])
    runner.select_moe_comm_method = select_moe_comm_method
    fused = ModuleType(plugin.IMPORTERS[plugin.SETUP][0])
    fused.setup_moe_comm_method = setup_moe_comm_method
    return {m.__name__: m for m in (context, methods, runner, fused)}


def _config(additional=None):
    return SimpleNamespace(additional_config={} if additional is None else additional)


def _patcher(modules, additional=None, env=None) -> plugin.Patcher:
    return plugin.Patcher(modules=modules, current_config=lambda: _config(additional),
                          make_comm_method=lambda moe_config: ("ubep", moe_config.ep_size), env=env or {})


def _fresh_enum() -> type[enum.Enum]:
    return enum.Enum("MoECommType", {m.name: m.value for m in FakeCommType})


@pytest.mark.parametrize("additional, env", [({"moe_comm": "ubep"}, {}), ({}, {ENV: "ubep"})])
def test_plugin_selects_ubep_under_the_setting(additional, env):
    comm_type = _fresh_enum()
    modules = fake_modules(comm_type)
    patcher = _patcher(modules, additional, env)
    patcher.install(meta_path=[])
    context, methods = modules[plugin.FORWARD_CONTEXT], modules[plugin.COMM_METHOD]
    ubep_type = comm_type.UBEP
    assert [m.name for m in comm_type][-1] == "UBEP" and comm_type("ubep") is ubep_type
    assert context.select_moe_comm_method(4, _config(additional)) is comm_type.MC2  # nothing set up yet
    methods.setup_moe_comm_method(SimpleNamespace(ep_size=4))
    assert methods._MoECommMethods[ubep_type] == ("ubep", 4)
    assert methods._MoECommMethods[comm_type.MC2] == "mc2"
    for tokens in (4, 4096):
        assert context.select_moe_comm_method(tokens, _config(additional), is_draft_model=False) is ubep_type
    # the modules that imported the functions by name hold the patched ones
    runner, fused = (modules[plugin.IMPORTERS[name][0]] for name in (plugin.SELECT, plugin.SETUP))
    assert runner.select_moe_comm_method is context.select_moe_comm_method
    assert fused.setup_moe_comm_method is methods.setup_moe_comm_method


def test_plugin_is_idempotent_and_off_without_the_setting():
    comm_type = _fresh_enum()
    modules = fake_modules(comm_type)
    patcher, meta_path = _patcher(modules), []
    patcher.install(meta_path=meta_path)
    context, methods = modules[plugin.FORWARD_CONTEXT], modules[plugin.COMM_METHOD]
    select, setup = context.select_moe_comm_method, methods.setup_moe_comm_method
    patcher.install(meta_path=meta_path)
    _patcher(modules, {"moe_comm": "ubep"}).install(meta_path=meta_path)  # another Patcher: still once
    assert context.select_moe_comm_method is select and methods.setup_moe_comm_method is setup
    assert not hasattr(getattr(select, plugin.ORIGINAL), plugin.ORIGINAL)  # wraps vllm-ascend's directly
    assert len(meta_path) == 1 and len(comm_type) == 5 and plugin.add_comm_type(comm_type) is comm_type.UBEP
    methods.setup_moe_comm_method(SimpleNamespace(ep_size=4))  # the setting is off in this Patcher
    assert comm_type.UBEP not in methods._MoECommMethods
    assert context.select_moe_comm_method(4, _config()) is comm_type.MC2
    assert context.select_moe_comm_method(4, _config({"moe_comm": "mc2"})) is comm_type.MC2


def test_plugin_leaves_ep_size_one_alone(caplog):
    comm_type = _fresh_enum()
    modules = fake_modules(comm_type)
    _patcher(modules, {"moe_comm": "ubep"}).install(meta_path=[])
    with caplog.at_level(logging.INFO, logger="vllm.ubep"):
        modules[plugin.COMM_METHOD].setup_moe_comm_method(SimpleNamespace(ep_size=1))
    assert comm_type.UBEP not in modules[plugin.COMM_METHOD]._MoECommMethods
    assert "expert parallelism is off" in caplog.text
    select = modules[plugin.FORWARD_CONTEXT].select_moe_comm_method
    assert select(4, _config({"moe_comm": "ubep"})) is comm_type.MC2


def test_plugin_survives_a_renamed_function(caplog):
    comm_type = _fresh_enum()
    modules = fake_modules(comm_type)
    del modules[plugin.FORWARD_CONTEXT].select_moe_comm_method
    with caplog.at_level(logging.WARNING, logger="vllm.ubep"):
        _patcher(modules, {"moe_comm": "ubep"}).install(meta_path=[])
    assert "cannot patch vllm_ascend.ascend_forward_context" in caplog.text


def test_register_without_vllm_ascend_does_nothing(monkeypatch, caplog):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    installed = []
    monkeypatch.setattr(plugin.DEFAULT, "install", lambda *a, **k: installed.append(1))
    with caplog.at_level(logging.INFO, logger="vllm.ubep"):
        plugin.register()
    assert not installed and "vllm-ascend is not installed" in caplog.text


FAKE_CONTEXT = """
    import enum
    class MoECommType(enum.Enum):
        ALLGATHER = 0
        MC2 = 1
        ALLTOALL = 2
        FUSED_MC2 = 3
    def select_moe_comm_method(num_tokens, vllm_config, is_draft_model=False):
        return MoECommType.MC2
"""
FAKE_METHODS = """
    from vllm_ascend.ascend_forward_context import MoECommType
    _MoECommMethods = {}
    def setup_moe_comm_method(moe_config):
        _MoECommMethods[MoECommType.MC2] = "mc2"
"""
FAKE_RUNNER = "from vllm_ascend.ascend_forward_context import select_moe_comm_method\n"


def test_import_hook_patches_modules_as_they_import(tmp_path, monkeypatch):
    """A fake ``vllm_ascend`` package on disk, imported after the hook is installed: each module is
    patched as its import ends, and a module that imports the function by name gets the patched one."""
    files = {"vllm_ascend/__init__.py": "", "vllm_ascend/ascend_forward_context.py": FAKE_CONTEXT,
             "vllm_ascend/ops/__init__.py": "", "vllm_ascend/ops/fused_moe/__init__.py": "",
             "vllm_ascend/ops/fused_moe/moe_comm_method.py": FAKE_METHODS,
             "vllm_ascend/worker/__init__.py": "", "vllm_ascend/worker/model_runner_v1.py": FAKE_RUNNER}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vllm_ascend" or m.startswith("vllm_ascend.")]:
        monkeypatch.delitem(sys.modules, name)
    meta_path = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", meta_path)
    patcher = plugin.Patcher(current_config=lambda: _config({"moe_comm": "ubep"}),
                             make_comm_method=lambda moe_config: "ubep", env={})
    patcher.install()
    assert "vllm_ascend.ascend_forward_context" not in sys.modules  # nothing imported early
    import vllm_ascend.worker.model_runner_v1 as runner
    from vllm_ascend import ascend_forward_context as context
    from vllm_ascend.ops.fused_moe import moe_comm_method as methods

    assert hasattr(context.select_moe_comm_method, plugin.ORIGINAL)
    assert runner.select_moe_comm_method is context.select_moe_comm_method
    methods.setup_moe_comm_method(SimpleNamespace(ep_size=2))
    assert methods._MoECommMethods[context.MoECommType.UBEP] == "ubep"
    assert context.select_moe_comm_method(8, _config({"moe_comm": "ubep"})) is context.MoECommType.UBEP


def test_entry_point_and_extra_declared():
    """pyproject.toml names the plugin in vLLM's entry-point group and pins the vllm-ascend it was read
    from, so that ``pip install ubep[vllm-ascend]`` and the setting are all a deployment needs."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"]["ubep_vllm_ascend"] == \
        "ubep.integrations.vllm_ascend.plugin:register"
    assert project["optional-dependencies"]["vllm-ascend"] == [f"vllm-ascend=={conformance.VERSION}"]
