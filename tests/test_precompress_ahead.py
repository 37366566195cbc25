"""The data files' gzip copies made ahead by the build's worker processes (precompress.Ahead) are the copies a
build without workers writes at the end: the same site byte for byte, and every copy is its file's bytes."""

from __future__ import annotations

import gzip
import hashlib
import warnings
from pathlib import Path

from cbsite.generator import build_site, precompress
from tests.helpers.site_archives import synthetic_run


def _digest(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(site.rglob("*")) if p.is_file()}


def _build(runs: Path, out: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_site(runs, out, quiet=True)


def test_copies_made_by_the_workers_are_the_copies_of_a_build_without_them(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for i in range(5):  # 5 run pages and 4 diffs: enough jobs for the pool (jobs.PARALLEL_MIN_JOBS)
        synthetic_run(runs, "toy", f"v{i + 1}", n=120, seed=i + 1, minutes=i, scale=1 + i / 10)
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "2")
    moved: list[set[str]] = []
    move_into = precompress.Ahead.move_into

    def recorded(self, site):
        moved.append(move_into(self, site))
        return moved[-1]

    monkeypatch.setattr(precompress.Ahead, "move_into", recorded)
    pooled = _build(runs, tmp_path / "pooled")
    run = next((pooled / "runs" / "toy" / "v5").iterdir()).relative_to(pooled).as_posix()
    assert {f"{run}/components.json", f"{run}/components.csv"} <= moved[0]  # made by the workers
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    alone = _build(runs, tmp_path / "alone")
    assert _digest(pooled) == _digest(alone)
    for rel in moved[0]:
        assert gzip.decompress((pooled / (rel + ".gz")).read_bytes()) == (pooled / rel).read_bytes(), rel
    assert not list(tmp_path.glob("pooled-artifacts-*"))  # the folder the copies were made in is gone
