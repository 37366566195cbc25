"""The project's cbsite configuration: the nearest `cbsite.toml`, or a `pyproject.toml` with a
`[tool.cbsite]` table, from the working directory upwards. Plugins and the regression gate read
their own keys of the same table."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from cbsite.errors import CbsiteError


def find_config(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """(file, table) of the nearest configuration from `start` upwards, or None."""
    for folder in [start, *start.parents]:
        own = folder / "cbsite.toml"
        if own.is_file():
            return own, read_toml(own)
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            table = read_toml(pyproject).get("tool", {}).get("cbsite")
            if table is not None:
                return pyproject, table
    return None


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CbsiteError(f"{path} is not valid TOML: {exc}") from exc
