"""The Jinja2 environment of the packaged templates (`cbsite/generator/templates/`), the addresses of the site's
pages and the writing of the data files the browser reads.

Templates produce the HTML of every page; this module gives them values, and cbsite.format's functions as filters.
Pages are `<folder>/index.md`, so a page's relative links are the same with or without directory URLs.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2
import orjson

from cbsite import format as cfmt
from cbsite.archive import Run

# Shipped inside the package (package data), so an installed wheel builds sites with no source tree.
TEMPLATES = Path(__file__).resolve().parent / "templates"


def run_url(run: Run) -> str:
    return f"runs/{run.model}/{run.version}/{run.run_id}/"


def model_url(model: str) -> str:
    return f"models/{model}/"


def diff_url(base: Run, head: Run, consecutive: bool) -> str:
    """Consecutive versions get a readable address; any other pair is named by its two run ids."""
    if consecutive:
        return f"diffs/{head.model}/{base.version}/{head.version}/"
    return f"diffs/runs/{base.run_id}/{head.run_id}/"


def root_of(url: str) -> str:
    """The relative prefix from a page folder back to the site root ('' for the home page)."""
    depth = len(PurePosixPath(url).parts)
    return "../" * depth


@functools.lru_cache(maxsize=4)
def environment(bytecode_dir: str | None = None) -> jinja2.Environment:
    """One environment per process: templates are compiled once, not once per build. With `bytecode_dir` (a
    build cache's folder) the compiled templates are also kept between processes (a second or so each)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        bytecode_cache=jinja2.FileSystemBytecodeCache(bytecode_dir) if bytecode_dir else None,
        autoescape=True,  # every page is HTML inside Markdown: escape every value, whatever the file suffix
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        ms=cfmt.fmt_ms, time=cfmt.fmt_time, bytes=cfmt.fmt_bytes, flops=cfmt.fmt_flops, pct=cfmt.fmt_pct,
        num=cfmt.fmt_num, signed=cfmt.fmt_signed, ratio=cfmt.fmt_ratio, rate=cfmt.fmt_rate,
        ms_range=cfmt.fmt_ms_range, speedup=cfmt.fmt_speedup,
        # YAML front matter: a JSON string is a valid YAML scalar, and tojson escapes <, >, & and '.
        yaml_str=lambda s: jinja2.utils.htmlsafe_json_dumps(str(s)),
    )
    env.globals.update(run_url=run_url, model_url=model_url, DASH=cfmt.DASH)
    return env


def dump_json(data: Any, path: Path) -> None:
    """Data files for the browser: sorted keys and no whitespace, so the same archive gives the same bytes.

    Written by orjson, a tenth of the time of the json module on a run's 0.4 MB of components (the build writes
    1.5 MB a run and its diff). Its JSON reads as the json module's does, but for number spelling (`0.00001`,
    `2.5e-7`) and non-string keys (sorted as text); a NaN or an infinity, which the data never hold (they
    are None where unknown), would be written as null, unknown. An integer past 64 bits, which orjson refuses
    (a FLOP count of 2**64 is not absurd), sends the file to the json module."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
    except orjson.JSONEncodeError:
        path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False),
                        encoding="utf-8")
