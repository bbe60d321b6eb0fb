"""Address spaces in Ascend C kernel sources, checked by a clang parse against the strict twin.

g++ cannot give ``__gm__`` and ``__ubuf__`` their own types, so the strict twin defines them empty
unless they are already defined; here clang parses the sources with ``__gm__`` as
``address_space(1)`` and ``__ubuf__`` as ``address_space(3)``, where mixing them with private
(unqualified) pointers is an error, as on the BiSheng compiler. ``address_space_errors`` takes any
list of sources and include directories (the kernels, once they build on the strict twin).
"""

import shutil
import subprocess
from pathlib import Path

import pytest

cindex = pytest.importorskip("clang.cindex")

ROOT = Path(__file__).resolve().parent.parent
STRICT = ROOT / "ascend_ops" / "cpu_twin" / "strict"
KERNEL = STRICT / "tests" / "address_space_kernel.cpp"

ADDRESS_SPACES = [
    "-D__gm__=__attribute__((address_space(1)))",
    "-D__ubuf__=__attribute__((address_space(3)))",
]


def _builtin_includes():
    """The pip libclang has no resource headers (stddef.h ...); borrow the host compiler's."""
    for cc in ("gcc", "cc", "clang"):
        if shutil.which(cc):
            out = subprocess.run([cc, "-print-file-name=include"], capture_output=True,
                                 text=True).stdout.strip()
            if out and Path(out, "stddef.h").exists():
                return ["-isystem", out]
    return []


def address_space_errors(sources, include_dirs, defines=()):
    """Errors of a clang parse of each source in the address-space mode: [(file, line, message)]."""
    args = ["-xc++", "-std=c++20", *ADDRESS_SPACES, *_builtin_includes()]
    args += [f"-I{d}" for d in include_dirs] + [f"-D{d}" for d in defines]
    index = cindex.Index.create()
    errors = []
    for source in sources:
        tu = index.parse(str(source), args=args)
        errors += [(str(d.location.file), d.location.line, d.spelling)
                   for d in tu.diagnostics if d.severity >= cindex.Diagnostic.Error]
    return errors


def test_clean_kernel_and_the_twin_parse_without_errors():
    assert address_space_errors([KERNEL], [STRICT]) == []


@pytest.mark.parametrize("case, message", [
    ("UBEP_BAD_GM_AS_PLAIN", "no matching function for call to 'Checksum'"),
    ("UBEP_BAD_PLAIN_TO_SET_GLOBAL_BUFFER", "no matching member function for call to 'SetGlobalBuffer'"),
    ("UBEP_BAD_UB_AS_GM", "no matching member function for call to 'SetGlobalBuffer'"),
])
def test_mixing_address_spaces_is_an_error(case, message):
    errors = address_space_errors([KERNEL], [STRICT], defines=[case])
    assert len(errors) == 1, errors
    path, _, spelling = errors[0]
    assert Path(path).name == KERNEL.name and message in spelling


def test_without_the_address_spaces_the_bad_cases_compile():
    """The errors above come from the address spaces alone: g++ (empty qualifiers) accepts them."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    for case in ("UBEP_BAD_GM_AS_PLAIN", "UBEP_BAD_PLAIN_TO_SET_GLOBAL_BUFFER", "UBEP_BAD_UB_AS_GM"):
        done = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", f"-I{STRICT}", f"-D{case}", str(KERNEL)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


KERNELS = sorted((ROOT / "ascend_ops" / "op_kernel").glob("*_kernel.cpp"))
KERNEL_INCLUDES = [STRICT, ROOT / "ascend_ops" / "op_kernel", ROOT / "ascend_ops" / "op_host",
                   ROOT / "scheduler" / "include"]


def test_the_kernels_keep_their_address_spaces():
    """Every GM address in the dispatch, combine, prepare and probe kernels stays ``__gm__``, and no UB
    offset is used as a pointer: the kernels parse without an error in the address-space mode."""
    assert [k.name for k in KERNELS] == ["combine_kernel.cpp", "dispatch_kernel.cpp", "prepare_kernel.cpp",
                                         "probe_kernel.cpp"]
    assert address_space_errors(KERNELS, KERNEL_INCLUDES, defines=["UBEP_CPU_TWIN"]) == []
