"""Argument checks shared by the configuration dataclasses: one wording for every message."""

from __future__ import annotations


def check_int(name: str, value: object, low: int | None = None) -> None:
    """Raise ``TypeError`` unless ``value`` is an int (bools are not), ``ValueError`` if ``< low``.

    Example: ``check_int("top_k", 0, 1)`` raises ``ValueError("top_k must be >= 1, got 0")``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
