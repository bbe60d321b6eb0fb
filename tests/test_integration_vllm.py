"""ubep as vLLM's MoE prepare/finalize (ubep/integrations/vllm/, docs/INTEGRATIONS.md).

- functional: vLLM's modular-kernel flow (prepare -> batched experts -> finalize into ``output``) on
  gloo ranks with the reference backend standing in for cuda, bit for bit against ``ubep.oracle``;
  the same with ``backend="cuda"`` on a GPU; where vLLM imports, vLLM's own ``FusedMoEKernel`` with
  its ``NaiveBatchedExperts`` and ``UbepPrepareAndFinalize``, and the plugin on vLLM's own modules;
- conformance: the classes, methods (names and parameter order), properties and factory used,
  against vLLM's source read with ``ast`` (``UBEP_VLLM_SRC`` or an installed vLLM; skipped without);
- registration: the plugin's settings and patches against fake vLLM modules.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
import sys
import textwrap
import types

import pytest
import torch

from tests.shared_gpu import run_on_gpus
from tests.vllm_workers import FlowCase, prepare_finalize_flow, vllm_kernel_flow, vllm_plugin_patches
from tests.workers import Case
from ubep import Buffer
from ubep.integrations import after_import
from ubep.integrations.vllm import conformance, core, plugin
from ubep.integrations.vllm.core import BufferSpec, Settings, UbepPrepareFinalizeCore
from ubep.launch import run_ranks

# -- functional -----------------------------------------------------------------------------------


def flows(world: int, backend: str) -> list[FlowCase]:
    tokens = tuple(6 + 3 * s if s != 1 else 0 for s in range(world))  # rank 1 has no tokens
    bf16 = Case(tokens=tokens, hidden=32, num_experts=4 * world, top_k=3, dtype="bf16", backend=backend,
                max_tokens=16, drop=0.2, seed=1)
    return [
        FlowCase(bf16),
        FlowCase(dataclasses.replace(bf16, dtype="fp16", maxvio=2.0, seed=2), reduce="expert_rank"),
        FlowCase(dataclasses.replace(bf16, top_k=1, dtype="fp32", drop=0.0, seed=3), weights_on_input=True),
    ]


@pytest.mark.parametrize("world", [2, 3])
def test_flow_matches_oracle_reference(world):
    """prepare -> gated MLP per expert -> finalize: the oracle's bits on every rank (weights in
    finalize, or on the input for top-1; both reductions; a rank without tokens)."""
    rows = run_ranks(prepare_finalize_flow, world, flows(world, "reference"), timeout_s=300)
    assert all(r > 0 for r in map(sum, zip(*rows, strict=True)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flow_matches_oracle_cuda():
    """The same flow over the cuda backend (one GPU per rank over NCCL, or ranks sharing GPU 0)."""
    pytest.importorskip("triton")
    rows = run_on_gpus(prepare_finalize_flow, 2, flows(2, "cuda"), timeout_s=600)
    assert all(r > 0 for r in map(sum, zip(*rows, strict=True)))


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install 'ubep[vllm]'); CI has none")


@needs_vllm
@pytest.mark.parametrize("flow", range(3), ids=["bf16", "fp16-expert_rank", "fp32-weights-on-input"])
def test_vllm_modular_kernel_with_ubep(flow):
    """vLLM's FusedMoEKernel (workspaces, prepare, NaiveBatchedExperts, finalize) over ubep's
    reference backend on 2 gloo ranks: the oracle's bits."""
    versions = run_ranks(vllm_kernel_flow, 2, flows(2, "reference")[flow], timeout_s=600)
    assert versions[0] == versions[1]


@needs_vllm
def test_plugin_patches_vllms_own_modules():
    """install() before vLLM's modules load: the factory (and the oracles' imported name), the
    batched-format property and the batched-DP default patched; no DP: vLLM's own factory."""
    assert run_ranks(vllm_plugin_patches, 1, timeout_s=600) == [["FusedMoEConfig", "True"]]


def _core(group, **spec) -> UbepPrepareFinalizeCore:
    fields = {"hidden": 8, "num_experts": 2, "top_k": 1, "max_tokens_per_rank": 4,
              "dtype": torch.float32, "backend": "reference"} | spec
    return UbepPrepareFinalizeCore(core.shared_buffer(group, BufferSpec(**fields)))


def test_core_contract(single_rank_group):
    """What vLLM reads of the prepare/finalize; calls out of order and weights that differ raise."""
    pf = _core(single_rank_group, top_k=2)
    assert (pf.num_dispatchers, pf.max_tokens_per_rank, pf.num_experts) == (1, 4, 2)
    assert core.shared_buffer(single_rank_group, BufferSpec(8, 2, 2, 4, torch.float32, "reference")) \
        is pf.buffer
    x, w, idx = torch.ones(3, 8), torch.full((3, 2), 0.5), torch.tensor([[0, 1]] * 3)
    with pytest.raises(RuntimeError, match="without a prepare"):
        pf.finalize(torch.empty(3, 8), torch.zeros(2, 4, 8), w, False)
    with pytest.raises(ValueError, match="top_k == 1"):
        pf.prepare(x, w, idx, True)
    recv, counts = pf.prepare(x, w, idx, False)
    assert recv.shape == (2, 4, 8) and counts.tolist() == [3, 3] and counts.dtype == torch.int32
    with pytest.raises(RuntimeError, match="twice"):
        pf.prepare(x, w, idx, False)
    with pytest.raises(ValueError, match="other topk_weights"):
        pf.finalize(torch.empty(3, 8), recv, w.clone(), False)
    pf.prepare(x, w, idx, False)
    out = torch.empty(3, 8)
    pf.finalize(out, recv, w, False)
    assert torch.equal(out, x)  # 0.5 * x + 0.5 * x
    core.release_shared_buffers()


def test_core_refuses_compact_and_quantized(single_rank_group):
    buf = Buffer(hidden=8, num_experts=2, top_k=1, max_tokens_per_rank=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="layout='padded'"):
        UbepPrepareFinalizeCore(buf)
    with pytest.raises(ValueError, match="quantization_config or --quantization"):
        core.refuse_quantized_activations(torch.float8_e4m3fn, defer_input_quant=False)
    core.refuse_quantized_activations(torch.float8_e4m3fn, defer_input_quant=True)  # experts quantize
    core.refuse_quantized_activations(None, defer_input_quant=False)


# -- conformance against vLLM's source ------------------------------------------------------------


def _source():
    try:
        found = conformance.find_source()
    except ValueError as err:
        pytest.fail(str(err))
    if found is None:
        pytest.skip(f"no vLLM source: set {conformance.ENV_SRC} to an unpacked vllm "
                    f"{conformance.VLLM_VERSION} (a directory holding the vllm package) or install vLLM")
    return found


def test_conformance_with_vllm_source():
    """Every class, method signature, property and the factory we patch, as vLLM's source has them."""
    source = _source()
    assert conformance.check_source(source) == [], f"vLLM {conformance.source_version(source)} at {source}"


MUTATIONS = {  # a change in vLLM -> the problem it must raise
    "finalize renamed": (conformance.MK, "    def finalize(\n", "    def finalize_v2(\n", "finalize"),
    "prepare parameters swapped": (conformance.MK, "a1: torch.Tensor,\n        topk_weights: torch.Tensor,\n"
                                   "        topk_ids:", "a1: torch.Tensor,\n        topk_ids: torch.Tensor,\n"
                                   "        topk_weights:", "prepare"),
    "factory parameter added": (conformance.FACTORY_FILE, "    eep_stage: bool = False,\n",
                                "    eep_stage: bool = False,\n    extra: int = 0,\n", "maybe_make"),
    "batched-DP property gone": (conformance.PARALLEL_CONFIG, "def use_batched_dp_moe(", "def batched_dp(",
                                 "use_batched_dp_moe"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_conformance_catches_a_changed_vllm(mutation, tmp_path):
    """A scratch copy of the files read, with one change: the check names it."""
    source = _source()
    file, old, new, named = MUTATIONS[mutation]
    for rel in {m.file for m in conformance.MEMBERS} | {conformance.MK, conformance.FACTORY_FILE,
                                                         conformance.DISTRIBUTED, conformance.PLUGINS}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / rel, tmp_path / rel)
    assert conformance.check_source(tmp_path) == []
    text = (tmp_path / file).read_text()
    assert old in text
    (tmp_path / file).write_text(text.replace(old, new, 1))
    problems = conformance.check_source(tmp_path)
    assert problems and any(named in p for p in problems), problems


def test_find_source_names_a_bad_directory(tmp_path):
    with pytest.raises(ValueError, match=conformance.ENV_SRC):
        conformance.find_source({conformance.ENV_SRC: str(tmp_path)})
    (tmp_path / "vllm" / conformance.MK).parent.mkdir(parents=True)
    (tmp_path / "vllm" / conformance.MK).write_text("")
    assert conformance.find_source({conformance.ENV_SRC: str(tmp_path)}) == tmp_path / "vllm"


# -- registration ---------------------------------------------------------------------------------


def test_settings_from_env():
    assert not Settings.from_env({}).enabled
    assert not Settings.from_env({"UBEP_VLLM": "0"}).enabled
    on = Settings.from_env({"UBEP_VLLM": "1", "UBEP_VLLM_SYNC": "sw", "UBEP_VLLM_REDUCE": "expert_rank"})
    assert (on.backend, on.effective_sync, on.reduce) == ("cuda", "sw", "expert_rank")
    assert Settings.from_env({"UBEP_VLLM": "cuda"}).effective_sync == "tff"
    assert "layout=padded" in on.describe() and "sync=sw" in on.describe()
    bad = [({"UBEP_VLLM": "deepep"}, "UBEP_VLLM"),
           ({"UBEP_VLLM": "1", "UBEP_VLLM_SYNC": "x"}, "UBEP_VLLM_SYNC"),
           ({"UBEP_VLLM": "1", "UBEP_VLLM_TIMEOUT_S": "0"}, "UBEP_VLLM_TIMEOUT_S")]
    for env, name in bad:
        with pytest.raises(ValueError, match=name):
            Settings.from_env(env)


FAKE_FACTORY = '''
def maybe_make_prepare_finalize(moe, quant_config, routing_tables=None, allow_new_interface=False,
                                use_monolithic=False, eep_stage=False):
    return ("vllm's", moe)
'''
FAKE_MOE_CONFIG = '''
class FusedMoEParallelConfig:
    def __init__(self, dp_size, use_ep):
        self.dp_size, self.use_ep = dp_size, use_ep

    @property
    def use_all2all_kernels(self):
        return self.dp_size > 1 and self.use_ep

    @property
    def use_batched_activation_format(self):
        return False
'''
FAKE_PARALLEL_CONFIG = '''
class ParallelConfig:
    def __init__(self, data_parallel_size, enable_expert_parallel):
        self.data_parallel_size, self.enable_expert_parallel = data_parallel_size, enable_expert_parallel

    @property
    def use_batched_dp_moe(self):
        return False
'''
FAKES = {plugin.FACTORY_MODULE: FAKE_FACTORY, plugin.MOE_CONFIG_MODULE: FAKE_MOE_CONFIG,
         plugin.PARALLEL_CONFIG_MODULE: FAKE_PARALLEL_CONFIG}


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A package ``vllm`` on disk holding the three modules the plugin patches (not imported yet),
    its modules removed from ``sys.modules`` and the plugin undone afterwards."""
    for name, text in FAKES.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        for parent in reversed(path.relative_to(tmp_path).parents[:-1]):
            (tmp_path / parent).mkdir(exist_ok=True)
            (tmp_path / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {n: m for n, m in sys.modules.items() if n == "vllm" or n.startswith("vllm.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    plugin.uninstall()
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def _moe(dp_size: int, use_ep: bool = True):
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

    return types.SimpleNamespace(moe_parallel_config=FusedMoEParallelConfig(dp_size, use_ep))


def test_register_off_patches_nothing(fake_vllm, monkeypatch):
    monkeypatch.delenv("UBEP_VLLM", raising=False)
    plugin.register()
    from vllm.model_executor.layers.fused_moe import all2all_utils

    assert not hasattr(all2all_utils.maybe_make_prepare_finalize, plugin.ORIGINAL)
    assert not any(isinstance(f, after_import.AfterImport) for f in sys.meta_path)


def test_register_without_vllm_logs_and_returns(monkeypatch, caplog):
    monkeypatch.setenv("UBEP_VLLM", "1")
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    with caplog.at_level(logging.INFO, logger="vllm.ubep"):
        plugin.register()
    assert "not importable" in caplog.text and plugin._State.settings is None


def test_install_patches_modules_imported_later(fake_vllm, caplog):
    """Patched as each import finishes; the factory builds ubep's only where vLLM runs all2all."""
    built = []
    with caplog.at_level(logging.INFO, logger="vllm.ubep"):
        assert plugin.install(Settings(backend="cuda"), lambda *a: built.append(a) or "ubep's")
        assert not plugin.install(Settings(backend="cuda"), lambda *a: "again")  # idempotent
    assert len(caplog.records) == 1 and "backend=cuda, layout=padded" in caplog.text
    assert "sync=tff" in caplog.text
    from vllm.config.parallel import ParallelConfig
    from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize

    assert maybe_make_prepare_finalize(_moe(2), None) == "ubep's"
    assert built[0][1:] == (None, Settings(backend="cuda"))
    assert maybe_make_prepare_finalize(_moe(1), None)[0] == "vllm's"  # no DP: vLLM's own
    assert maybe_make_prepare_finalize(_moe(2, use_ep=False), None)[0] == "vllm's"
    assert _moe(2).moe_parallel_config.use_batched_activation_format
    assert not _moe(1).moe_parallel_config.use_batched_activation_format
    assert ParallelConfig(2, True).use_batched_dp_moe and not ParallelConfig(2, False).use_batched_dp_moe
    with pytest.raises(ValueError, match="monolithic"):
        maybe_make_prepare_finalize(_moe(2), None, use_monolithic=True)
    with pytest.raises(ValueError, match="elastic"):
        maybe_make_prepare_finalize(_moe(2), None, None, False, False, True)


def test_install_patches_imported_modules_and_their_importers(fake_vllm):
    """Modules already imported are patched at once, with every ``from ... import`` of the factory;
    patching again (a second install after uninstall aside) keeps one layer of wrapping."""
    from vllm.model_executor.layers.fused_moe import all2all_utils

    original = all2all_utils.maybe_make_prepare_finalize
    importer = types.ModuleType("vllm.fake_oracle")
    importer.maybe_make_prepare_finalize = original
    sys.modules[importer.__name__] = importer
    plugin.install(Settings(backend="reference"), lambda *a: "ubep's")
    assert importer.maybe_make_prepare_finalize is all2all_utils.maybe_make_prepare_finalize
    assert importer.maybe_make_prepare_finalize(_moe(4), None) == "ubep's"
    patched = all2all_utils.maybe_make_prepare_finalize
    plugin.patch_factory(all2all_utils, settings=Settings(backend="reference"), builder=lambda *a: "x")
    assert all2all_utils.maybe_make_prepare_finalize is patched
    plugin.uninstall()
    assert importer.maybe_make_prepare_finalize is original is all2all_utils.maybe_make_prepare_finalize


def test_entry_point_and_extra_declared():
    """pyproject.toml names the plugin in vLLM's entry-point group and pins the vLLM it was read from."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][conformance.PLUGIN_GROUP]["ubep_vllm"] == \
        "ubep.integrations.vllm.plugin:register"
    assert project["optional-dependencies"]["vllm"] == [f"vllm=={conformance.VLLM_VERSION}"]
