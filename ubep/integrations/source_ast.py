"""Reading an engine's source with ``ast`` (nothing of the engine is imported, so its dependencies need
not be installed): what the vLLM and vLLM-Ascend conformance checks share. Where a package's source
is found, its parsed files, and the classes, functions, methods and parameter lists in them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

Function = ast.FunctionDef | ast.AsyncFunctionDef


def installed_package_dir(package: str) -> Path | None:
    """The directory of an installed ``package``, found without importing it; None if not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


class ParsedPackage:
    """The parsed files of one package, by path relative to it (None: the file is missing)."""

    def __init__(self, package: Path):
        self.package = package
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            path = self.package / rel
            self._trees[rel] = ast.parse(path.read_text(), filename=str(path)) if path.is_file() else None
        return self._trees[rel]


def class_def(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def methods(cls: ast.ClassDef) -> dict[str, Function]:
    return {n.name: n for n in cls.body if isinstance(n, Function)}


def function_def(tree: ast.Module, qualname: str) -> Function | None:
    """A module-level function, or ``"Class.method"``."""
    if "." in qualname:
        cls_name, name = qualname.split(".", 1)
        cls = class_def(tree, cls_name)
        return methods(cls).get(name) if cls is not None else None
    return next((n for n in tree.body if isinstance(n, Function) and n.name == qualname), None)


def params(fn: Function) -> tuple[str, ...]:
    """Parameter names in order, ``*args`` / ``**kwargs`` with their stars."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append(f"*{a.vararg.arg}")
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(f"**{a.kwarg.arg}")
    return tuple(names)


def dotted(node: ast.expr) -> str:
    """``a.b.c`` of a name, attribute or call expression; "" for anything else."""
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return dotted(node.func)
    return node.id if isinstance(node, ast.Name) else ""


def decorators(fn: Function) -> set[str]:
    return {dotted(d).split(".")[-1] for d in fn.decorator_list}
