"""Where a full `cbsite build`'s wall time goes: each stage timed in the build's main process.

Prints, for the stages of build.py (the workers' run pages and diffs, the pages' Markdown, MkDocs, the `.gz` copies),
when each started and ended (seconds from the start) and the main process's CPU seconds inside it (the workers'
wait is printed once per group of jobs: runs, then diffs; the first one waits). No cache. Usage:

    .venv/bin/python benchmarks/build_stages.py RUNS_FOLDER SITE_FOLDER
    .venv/bin/python benchmarks/build_scale.py --runs 1000 --big 0 --keep /tmp/scale   # an archive to time
    .venv/bin/python benchmarks/build_stages.py /tmp/scale/runs-1000x1000 /tmp/scale/site-stages
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbsite.generator import build as gbuild
from cbsite.generator import jobs, precompress

T0 = time.perf_counter()


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _timed(owner: Any, name: str, label: str) -> None:
    real: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, cpu = time.perf_counter(), _cpu()
        try:
            return real(*args, **kwargs)
        finally:
            print(f"{label:44} {start - T0:7.1f} {time.perf_counter() - T0:7.1f} {_cpu() - cpu:9.1f}", flush=True)

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path)
    ap.add_argument("site", type=Path)
    args = ap.parse_args()
    _timed(jobs.Jobs, "_wait", "waiting for the workers (runs, diffs)")
    _timed(gbuild, "_render_diffs", "diff pages' Markdown")
    _timed(gbuild, "render_docs", "every page's Markdown (from the start)")
    _timed(gbuild, "_trend_specs", "a model's trend charts (Altair)")
    _timed(gbuild, "_write_assets", "the assets (the Vega bundles)")
    _timed(gbuild, "_mkdocs_build", "MkDocs")
    _timed(precompress, "write_beside", ".gz copies (the rest)")
    print(f"{'stage':44} {'start s':>7} {'end s':>7} {'main CPU s':>9}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gbuild.build(args.runs, args.site, quiet=True, cache=None)
    print(f"total {time.perf_counter() - T0:.1f} s wall, {_cpu():.1f} s CPU in the main process")


if __name__ == "__main__":
    main()
