"""A model's per-component history: each component's latency, FLOPs, size and peak memory across its versions.

One page per model (models/<model>/history/) shows the component named by `#component=<path>`; its data are an
index (the versions, their runs and every path) and the series of each path, split into files of a few paths in
path order, so the page fetches the index and one small file whatever the number of versions and components.
A version stands for its newest run, as in the trends and diffs. A component is matched by its path only: absent
from a version, its values there are null (a gap); a renamed component is two histories, never guessed as one.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from cbsite import archive
from cbsite.archive import Run
from cbsite.generator import templating

# Series key -> (phase, column); latency and FLOPs are per forward of the model (per call x calls), as the run
# table shows them; the size is the subtree's parameters and buffers, the same in both phases.
SERIES: dict[str, tuple[str, str]] = {
    "forward.latency_ms": ("forward", "latency_ms"),
    "backward.latency_ms": ("backward", "latency_ms"),
    "forward.flops": ("forward", "flops"),
    "backward.flops": ("backward", "flops"),
    "param_bytes": ("forward", "param_bytes"),
    "forward.peak_memory_bytes": ("forward", "peak_memory_bytes"),
    "backward.peak_memory_bytes": ("backward", "peak_memory_bytes"),
}
_COLUMNS = {"path": pl.String, "phase": pl.String, "order": pl.Int64, "call_count": pl.Int64, "latency_ms": pl.Float64,
            "flops": pl.Float64, "param_bytes": pl.Int64, "peak_memory_bytes": pl.Int64}
NUMBERS_PER_FILE = 16384  # values a series file holds, about (versions present x series per path): ~100 kB of JSON
DIGITS = 4  # significant digits of the display data (the archive keeps full precision)
FOLDER = "history"  # beside the model page


def _frame(run: Run, index: int) -> pl.DataFrame:
    """The run's rows this history needs (columns an older schema lacks are null), tagged with the version's place."""
    assert run.path is not None
    file = run.path / archive.COMPONENTS_FILE
    have = pl.read_parquet_schema(file)
    df = pl.read_parquet(file, columns=[c for c in _COLUMNS if c in have])
    return df.select(*(pl.col(c).cast(t) if c in have else pl.lit(None, dtype=t).alias(c) for c, t in _COLUMNS.items()),
                     pl.lit(index, dtype=pl.Int32).alias("v"))


def _phase(df: pl.DataFrame, phase: str) -> pl.DataFrame:
    keys = [k for k, (p, _) in SERIES.items() if p == phase]
    return df.filter(pl.col("phase") == phase).select("path", "v", *(pl.col(SERIES[k][1]).alias(k) for k in keys))


def model_history(model: str, newest: list[Run]) -> dict[str, str]:
    """The history files of one model, {file name: JSON text}, from the newest run of each version, oldest first.

    A series file is a list of {"path", "v": the places of the versions that have the path, then each series'
    values at those places}, in path order; the index says where each file starts. Computed in polars and written
    by it: a model of hundreds of versions of thousands of components is millions of values."""
    frames = [_frame(run, i) for i, run in enumerate(newest)]
    df = pl.concat(frames) if frames else pl.DataFrame(schema={**_COLUMNS, "v": pl.Int32})
    calls = pl.max_horizontal(pl.col("call_count").fill_null(1), pl.lit(1))
    # One row per (path, phase, version): the last, as the run page takes a phase's values from its last row.
    df = (df.sort(["v", "order", "phase"], maintain_order=True)
          .unique(["path", "phase", "v"], keep="last", maintain_order=True)
          .with_columns((pl.col("latency_ms") * calls).alias("latency_ms"), (pl.col("flops") * calls).alias("flops")))
    wide = (_phase(df, "forward").join(_phase(df, "backward"), on=["path", "v"], how="full", coalesce=True)
            .with_columns(pl.col(pl.Float64).fill_nan(None).round_sig_figs(DIGITS))
            .sort(["path", "v"]))
    grouped = wide.group_by("path", maintain_order=True).agg(pl.col("v"), *(pl.col(k) for k in SERIES))
    # Files of about NUMBERS_PER_FILE values: a path's values never split across two.
    sizes = grouped.get_column("v").list.len() * (len(SERIES) + 1)
    grouped = grouped.with_columns(((sizes.cum_sum() - sizes) // NUMBERS_PER_FILE).alias("file"))
    parts = grouped.partition_by("file", maintain_order=True, include_key=False) if grouped.height else []
    paths: list[str] = grouped.get_column("path").to_list()
    starts, at = [], 0
    for part in parts:
        starts.append(at)
        at += part.height
    index = {"model": model, "versions": [r.version for r in newest], "runs": [r.run_id for r in newest],
             "urls": [templating.run_url(r) for r in newest], "paths": paths, "starts": starts, "series": list(SERIES)}
    files = {"index.json": json.dumps(index, sort_keys=True, separators=(",", ":"), ensure_ascii=False)}
    for k, part in enumerate(parts):
        files[f"{k}.json"] = part.write_json()
    return files


def write(files: dict[str, str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
