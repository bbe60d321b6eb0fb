"""build.sh says what it is doing before each long step, with python, cmake and ctest replaced by
stubs that log their calls (into the same file as the script's output, so their order shows)."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUB = """#!/bin/sh
echo "STUB $(basename "$0") $*" >> "$STUB_LOG"
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run_build(tmp_path: Path, *args: str) -> list[str]:
    """The lines of ``./build.sh args`` run on a copy of the script among stubs, in order."""
    shutil.copy(ROOT / "build.sh", tmp_path / "build.sh")
    (tmp_path / "build").mkdir()  # ctest runs in the folder the cmake stub does not make
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "cmake", "ctest"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(stat.S_IRWXU)
    log = tmp_path / "out.log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": str(bin_dir / "python"), "STUB_LOG": str(log)}
    with open(log, "a") as out:
        done = subprocess.run(["bash", str(tmp_path / "build.sh"), *args], stdout=out,
                              stderr=subprocess.STDOUT, env=env, timeout=60)
    lines = log.read_text().splitlines()
    assert done.returncode == 0, lines
    return lines


def _index(lines: list[str], start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(start))


def test_demo_announces_the_install(tmp_path):
    lines = run_build(tmp_path, "demo", "--ranks", "2")
    assert _index(lines, "installing ubep") < _index(lines, "STUB python -m pip install --quiet -e .")
    assert lines[-1] == "STUB python -m ubep.cli demo --ranks 2"


def test_test_announces_each_long_step_and_shows_pytest_progress(tmp_path):
    lines = run_build(tmp_path, "test", "-x")
    steps = [("installing ubep", "STUB python -m pip install --quiet -e .[test]"),
             ("building the C++ twins", "STUB cmake -S . -B build"),
             ("running the tests", "STUB python -m pytest")]
    for said, stub in steps:
        assert _index(lines, said) < _index(lines, stub), lines
    pytest_call = lines[_index(lines, "STUB python -m pytest")].split()
    assert "-q" not in pytest_call and "console_output_style=count" in pytest_call
    assert pytest_call[-1] == "-x"
