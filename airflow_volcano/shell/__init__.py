"""The shell scripts (and the argv shim) that pods run: package data, checked by shellcheck, shipped
unchanged (in the training script's ConfigMap, or inline as `sh -c`)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def read(name: str) -> str:
    """One of this package's files, as text."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
