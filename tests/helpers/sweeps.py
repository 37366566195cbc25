"""What the sweep tests share: a tiny nanogpt sweep's collect arguments and the runs a sweep wrote, by version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Both peaks given and --no-calibrate: these tests hold sweeps, not the CPU calibration (test_peaks holds that).
NANO = ["nanogpt", "-o", "size=tiny", "--max-depth", "1", "--budget", "0.002", "--peak-flops", "1e11",
        "--peak-bandwidth", "1e10", "--no-calibrate", "--no-progress", "--batches", "1"]


def runs_by_version(root: Path) -> dict[str, dict[str, Any]]:
    from cbsite.archive import list_runs, read_meta

    return {r.version: read_meta(r.path) for r in list_runs(root)}
