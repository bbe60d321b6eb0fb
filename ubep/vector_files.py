"""The command line of every module that writes a shared test-vector file (``tests/vectors/*.json``):
``python -m <module> [--write PATH]`` writes the module's ``render()`` to PATH, or prints it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def as_json(vectors: dict) -> str:
    """The file text of a vector set written as one indented JSON document."""
    return json.dumps(vectors, indent=1) + "\n"


def main(render: Callable[[], str], doc: str, argv: list[str] | None = None) -> None:
    """Parse ``argv`` (``--write PATH``) and write or print ``render()``; ``doc`` describes the file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the vectors to this path (default: print)")
    args = parser.parse_args(argv)
    text = render()
    if args.write is None:
        print(text, end="")
    else:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
