"""Removes each synchronization of the Ascend C kernels in turn and checks that a twin test fails.

The strict twin (ascend_ops/cpu_twin/strict) is only worth its name if a kernel that drops a
hand-off the chip needs fails on it. This script finds every synchronization statement in
ascend_ops/op_kernel (``Sync<HardEvent::...>()``, ``PipeBarrier<...>()``, ``SyncAll()``,
``DataCacheCleanAndInvalid<...>(...)``, ``SetFlag`` / ``WaitFlag``, queue ``EnQue`` / ``DeQue``),
and for each one, in a scratch copy of the repository: replaces the call with ``(void)0``, rebuilds
the twin operator library, and runs a short twin test (``--check``). A removal the test does not
notice is reported as MISSED; the script exits 1 if there is any.

    python ascend_ops/tools/mutate_syncs.py --list                # the sites, nothing built
    python ascend_ops/tools/mutate_syncs.py [--only REGEX] [--out results.csv]

Each site takes one incremental build of libubep_ascend_twin (tens of seconds on 2 cores) and one
run of the check (seconds): the whole set takes about an hour.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "ascend_ops" / "op_kernel"
# ep_sync.h defines Sync itself (SetFlag then WaitFlag): its uses are the sites, not its body.
SKIPPED_FILES = {"ep_sync.h"}
CALL = re.compile(r"(?:AscendC::)?(?:Sync<HardEvent::\w+>\(\)|PipeBarrier<PIPE_\w+>\(\)|"
                  r"SyncAll(?:<\w+>)?\(\)|DataCacheCleanAndInvalid<[^;]*?>\([^;]*?\)|(?:SetFlag|WaitFlag)<[^;]*?>\([^;]*?\)|"
                  r"\w+\.(?:EnQue|DeQue)(?:<\w+>)?\([^;]*?\))")
# W = 2 in four rounds of modes and W = 8 (more dies than AIVs: every AIV serves several peers), a
# routing longer than one UB window (reloads), a preparation while a late die still writes, one
# while an AIV of a die fills far behind the others, and the tear-free write probe (its own rows and
# a probe while an AIV fills late).
DEFAULT_CHECK = ("{python} -m pytest -x -q -p no:cacheprovider tests/test_ascend.py "
                 "tests/test_ascend_probe.py -k '(test_matches_oracle and (2-4 or 8-1)) or "
                 "longer_than_one_ub_window or waits_for_a_late_die or every_aiv or "
                 "(layer_survives_the_probe and 4) or no_writer_starts'")
COPIED = ("ascend_ops", "scheduler", "ubep", "tests", "CMakeLists.txt", "pyproject.toml")


@dataclass(frozen=True)
class Site:
    """One synchronization call: ``path`` (relative to the repository), 1-based ``line``, the call's
    ``start`` / ``end`` offsets in the file, and its text."""

    path: str
    line: int
    start: int
    end: int
    text: str

    def mutate(self, source: str) -> str:
        return source[: self.start] + "(void)0" + source[self.end :]


def _code_spans(source: str) -> list[tuple[int, int]]:
    """``[start, end)`` of the text outside comments (``//`` and ``/* */``)."""
    spans, at = [], 0
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", source, flags=re.S):
        spans.append((at, m.start()))
        at = m.end()
    spans.append((at, len(source)))
    return spans


def find_sites(kernels: Path = KERNELS) -> list[Site]:
    """Every synchronization call in the kernel sources, in file and line order."""
    sites = []
    for path in sorted([*kernels.glob("*.h"), *kernels.glob("*.cpp")]):
        if path.name in SKIPPED_FILES:
            continue
        source = path.read_text()
        for lo, hi in _code_spans(source):
            for m in CALL.finditer(source, lo, hi):
                line = source.count("\n", 0, m.start()) + 1
                sites.append(Site(str(path.relative_to(ROOT)), line, m.start(), m.end(), m.group(0)))
    return sites


def _scratch(work: Path) -> Path:
    """A copy of what the twin build and its tests need, in ``work/src``; rebuilt from scratch."""
    src = work / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for name in COPIED:
        target = ROOT / name
        if target.is_dir():
            shutil.copytree(target, src / name, ignore=shutil.ignore_patterns("__pycache__", "build*"))
        else:
            shutil.copy2(target, src / name)
    return src


def _run(cmd: str, cwd: Path, env: dict, timeout: int) -> tuple[bool, str]:
    try:
        done = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    return done.returncode == 0, (done.stdout + done.stderr)[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the sites and exit")
    parser.add_argument("--only", help="only sites whose 'path:line text' matches this regex")
    parser.add_argument("--work", default="/tmp/ubep-mutate", help="scratch folder (source copy and build)")
    parser.add_argument("--check", default=DEFAULT_CHECK, help="the twin test run after each removal")
    parser.add_argument("--timeout", type=int, default=600, help="seconds each build or check may take")
    parser.add_argument("--out", help="also write the results as CSV here")
    args = parser.parse_args(argv)
    sites = [s for s in find_sites()
             if not args.only or re.search(args.only, f"{s.path}:{s.line} {s.text}")]
    if args.list:
        for s in sites:
            print(f"{s.path}:{s.line}  {s.text}")
        print(f"{len(sites)} sites")
        return 0
    work = Path(args.work)
    src = _scratch(work)
    build = work / "build"
    env = {**os.environ, "PYTHONPATH": str(src),
           "UBEP_ASCEND_LIB": str(build / "ascend_ops" / "libubep_ascend_twin.so")}
    ok, log = _run(f"cmake -S {src} -B {build} -DCMAKE_BUILD_TYPE=Release && "
                   f"cmake --build {build} -j2 --target ubep_ascend_twin", src, env, args.timeout)
    check = args.check.format(python=sys.executable)
    if not ok or not _run(check, src, env, args.timeout)[0]:
        print(f"the unmutated kernels do not build or pass the check:\n{log}", file=sys.stderr)
        return 2
    results = []
    for n, site in enumerate(sites, 1):
        path = src / site.path
        original = path.read_text()
        path.write_text(site.mutate(original))
        began = time.monotonic()
        try:
            built, log = _run(f"cmake --build {build} -j2 --target ubep_ascend_twin", src, env, args.timeout)
            caught = (not _run(check, src, env, args.timeout)[0]) if built else None
        finally:
            path.write_text(original)
        verdict = {True: "caught", False: "MISSED", None: "no build"}[caught]
        results.append((site, verdict))
        print(f"[{n}/{len(sites)}] {verdict:8} {site.path}:{site.line}  {site.text}  "
              f"({time.monotonic() - began:.0f} s)", flush=True)
    _run(f"cmake --build {build} -j2 --target ubep_ascend_twin", src, env, args.timeout)  # unmutated again
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "line", "call", "verdict"])
            writer.writerows([s.path, s.line, s.text, v] for s, v in results)
    missed = [s for s, v in results if v != "caught"]
    print(f"{len(results) - len(missed)} of {len(results)} removals caught")
    for s in missed:
        print(f"  not caught: {s.path}:{s.line}  {s.text}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
