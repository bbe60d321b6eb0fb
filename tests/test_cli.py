"""The `ubep` command line: help text, usage errors, and what this machine lacks said in one line
before any rank starts."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ubep.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--ranks", "2", "--tokens", "8", "--hidden", "16", "--experts", "4", "--top-k", "2"]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU says")


@pytest.mark.parametrize("command", ["demo", "profile", "simulate", "probe"])
def test_help_gives_each_default_once(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert not re.search(r"\(default: [^)]*\) \(default:", text), text
    assert "(default: None)" not in text


@pytest.mark.parametrize(("argv", "words"), [
    (["demo", "--ranks", "3", "--experts", "8"], "--experts 8 must be a multiple of --ranks 3"),
    (["profile", "--tokens", "8", "--buffer-tokens", "4"], "--buffer-tokens 4 must be >= --tokens 8"),
])
def test_cross_option_errors_show_the_subcommand_usage(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: ubep {argv[0]} ")
    assert f"ubep {argv[0]}: error: {words}" in err


def _refused(capsys, argv: list[str], option: str) -> str:
    """``argv`` exits with status 2 and one line on stderr naming ``option``, no ranks started; the
    line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@no_gpu
def test_pg_nccl_without_a_gpu_is_refused_before_spawning(capsys):
    _refused(capsys, ["profile", *SMALL, "--pg", "nccl"], "--pg nccl")


@no_gpu
@pytest.mark.parametrize("command", ["demo", "profile"])
def test_cuda_backend_without_a_gpu_is_refused_before_spawning(capsys, command):
    _refused(capsys, [command, *SMALL, "--backend", "cuda"], "--backend cuda")


def test_cuda_backend_without_triton_is_refused_before_spawning(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed
    _refused(capsys, ["profile", *SMALL, "--backend", "cuda", "--pg", "nccl"], "--backend cuda")


def test_demo_says_its_ranks_cannot_run_the_cuda_backend(capsys, monkeypatch):
    """Even on a GPU machine: the demo's ranks are CPU processes over gloo."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "gloo" in _refused(capsys, ["demo", *SMALL, "--backend", "cuda"], "--backend cuda")


def test_ascend_backend_without_its_library_is_refused_before_spawning(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("UBEP_ASCEND_LIB", str(tmp_path / "missing.so"))
    _refused(capsys, ["demo", *SMALL, "--backend", "ascend"], "--backend ascend")


def _ubep_without(blocked: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """``ubep argv`` in a fresh interpreter where the modules ``blocked`` cannot be imported."""
    script = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
              f"from ubep.cli import main\nsys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_simulate_list_needs_no_simpy_and_prints_whole_descriptions():
    """Listing imports no simpy nor matplotlib (both blocked here); each description is wrapped, whole."""
    run = _ubep_without(["simpy", "matplotlib"], ["simulate", "--list"])
    assert run.returncode == 0, run.stderr
    from ubep.sim.scenarios import SCENARIOS

    listed = " ".join(run.stdout.split())
    for name, fn in SCENARIOS.items():
        assert f"{name} {' '.join(fn.__doc__.split())}" in listed
    assert max(map(len, run.stdout.splitlines())) <= 100


def test_simulate_without_simpy_says_what_to_install():
    run = _ubep_without(["simpy"], ["simulate", "--scenario", "paper-fig10"])
    assert run.returncode == 2
    assert run.stderr.strip() == ("ubep simulate: running a scenario needs the sim extras (missing: simpy): "
                                  "pip install 'ubep[sim]'")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and a git checkout")
def test_default_output_folders_are_ignored_by_git(capsys):
    folders = set()
    for command in ("profile", "simulate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        folders.add(re.search(r"--out OUT .*?\(default: ([^)]+)\)", text).group(1))
    assert folders == {"ubep-profile-out", "ubep-sim-out"}
    for folder in folders:
        check = subprocess.run(["git", "check-ignore", "-q", f"{folder}/breakdown.csv"], cwd=ROOT)
        assert check.returncode == 0, f"{folder}/ is not in .gitignore"
