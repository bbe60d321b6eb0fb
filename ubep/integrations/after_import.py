"""Patching a module right after its import runs, without importing it early.

The engine plugins (vLLM's, vllm-ascend's) load before the engine's modules; importing those early
would change the engine's start-up, so a patch waits on ``sys.meta_path`` for its module instead.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, MutableMapping
from types import ModuleType

Patch = Callable[[ModuleType], None]


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with pending patches it asks the other finders of
    ``meta_path`` and wraps the loader they give, so that the patches run once the module's code has
    (each once: they are dropped when they run)."""

    def __init__(self, meta_path: list):
        self.meta_path = meta_path
        self.pending: dict[str, list[Patch]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in self.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.pending.pop(fullname))
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patches: list[Patch]):
        self.loader, self.patches = loader, patches

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        for patch in self.patches:
            patch(module)

    def __getattr__(self, name: str):  # get_source, get_data, is_package, ...: the real loader's
        return getattr(self.loader, name)


def finder(meta_path: list | None = None) -> AfterImport:
    """The ``AfterImport`` of ``meta_path`` (``sys.meta_path`` by default), put first if it has none."""
    meta_path = sys.meta_path if meta_path is None else meta_path
    for f in meta_path:
        if isinstance(f, AfterImport):
            return f
    found = AfterImport(meta_path)
    meta_path.insert(0, found)
    return found


def when_imported(name: str, patch: Patch, *, modules: MutableMapping[str, ModuleType] | None = None,
                  meta_path: list | None = None) -> None:
    """``patch(module)`` now if module ``name`` is in ``modules`` (``sys.modules``), else right after
    its import runs."""
    module = (sys.modules if modules is None else modules).get(name)
    if module is not None:
        patch(module)
        return
    finder(meta_path).pending.setdefault(name, []).append(patch)


def remove(meta_path: list | None = None) -> None:
    """Drop every pending patch and the finder (for tests)."""
    meta_path = sys.meta_path if meta_path is None else meta_path
    for f in [f for f in meta_path if isinstance(f, AfterImport)]:
        f.pending.clear()
        meta_path.remove(f)
