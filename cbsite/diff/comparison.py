"""Latency evidence between two runs: the comparison record of a paired session, or both runs' rounds.

Core module (no torch, no jinja2). The gate, `cbsite diff` and the site ask one question here: *given
these two runs, what is known about each component's latency change?* Three answers, best first:

1. **paired**: a `cbsite compare` session measured both runs' models in the same worker processes,
   in random A/B block pairs. Its record lives in the archive under
   `<root>/_comparisons/<comparison id>/` (`comparison.json` + `samples.parquet`, both arms); the unit
   is a process (or a neighbour pair of processes in the ABBA layout).
2. **rounds**: both runs were collected with `--rounds N` (N >= 2): each run's samples give a median
   per round, and Welch's test compares the rounds (the unit is a round).
3. **none**: single-round runs. Latency is then *not judged*: a within-run spread says nothing about
   the run-to-run noise, which measured twice as large on a shared machine.

`_comparisons` is not a valid model name (it starts with `_`), so archive listings never mistake it
for a model, and its files are not named `components.parquet`, so the documented reader glob
`runs/**/components.parquet` never reads them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from cbsite import archive, schema, stats
from cbsite import format as cfmt
from cbsite.errors import CbsiteError

COMPARISONS_DIR = "_comparisons"
COMPARISON_JSON = "comparison.json"
COMPARISON_VERSION = 1
MIN_CLEAN_PAIRS = 3  # fewer clean pairs in a process: its unit uses every pair instead
NOT_JUDGED_HINT = "collect with `cbsite compare` or `cbsite collect --rounds N` (N >= 2) to judge latency"
NOT_JUDGED = "not judged (single round)"  # the judgement of latency with no evidence: one round per run
CHANGE_WORDS = ("regressed", "improved")


def judgement(v: stats.Verdict | None, floor: float = stats.FLOOR) -> str:
    """The one word every report prints for a latency change: the verdict, NOT_JUDGED without one, and "below
    the N % floor" for an inconclusive change that is real (significant) but smaller than the floor, which a
    reader would otherwise take for missing evidence."""
    if v is None:
        return NOT_JUDGED
    if (v.verdict == "inconclusive" and v.ratio is not None and v.ratio > 0 and floor > 0
            and abs(math.log(v.ratio)) < math.log1p(floor) and v.ci_low is not None and v.ci_high is not None
            and (v.ci_low > 1.0 or v.ci_high < 1.0)):
        return f"below the {cfmt.pct_spaced(floor, False)} floor"
    return v.verdict


def write_comparison(root: str | os.PathLike[str], record: dict[str, Any], samples: pa.Table | None) -> Path:
    """Write a comparison record atomically, as runs are written (archive.py): staged in the archive's
    staging area under names no reader glob matches, renamed into place, comparison.json last."""
    folder = Path(root) / COMPARISONS_DIR
    final = folder / record["comparison_id"]
    if final.exists():
        raise CbsiteError(f"comparison {record['comparison_id']} already exists at {final}")
    folder.mkdir(parents=True, exist_ok=True)
    staging = archive.new_staging(archive.staging_dir(root), f"comparison-{record['comparison_id']}-")
    try:
        record_file = archive._staged(staging, COMPARISON_JSON)
        record_file.write_text(json.dumps(cfmt.json_safe(record), indent=1, sort_keys=True) + "\n")
        if samples is not None and samples.num_rows:
            pq.write_table(samples.cast(schema.SAMPLES_SCHEMA), archive._staged(staging, archive.SAMPLES_FILE))
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staged_samples = archive._staged(final, archive.SAMPLES_FILE)
    if staged_samples.exists():
        os.replace(staged_samples, final / archive.SAMPLES_FILE)
    os.replace(archive._staged(final, COMPARISON_JSON), final / COMPARISON_JSON)  # the record exists from here
    (final / archive.OWNER_FILE).unlink(missing_ok=True)
    return final


def list_comparisons(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable comparison record of the archive, oldest first (unreadable ones are skipped)."""
    folder = Path(root) / COMPARISONS_DIR
    out: list[dict[str, Any]] = []
    if not folder.is_dir():
        return out
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not (entry / COMPARISON_JSON).is_file():
            continue
        try:
            record = json.loads((entry / COMPARISON_JSON).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and record.get("comparison_version") == COMPARISON_VERSION:
            record["_path"] = str(entry)
            out.append(record)
    return out


def find_comparison(root: str | os.PathLike[str], base_run_id: str, head_run_id: str) -> dict[str, Any] | None:
    """The newest comparison that measured exactly these two runs, if any."""
    hits = [r for r in list_comparisons(root)
            if r.get("base", {}).get("run_id") == base_run_id and r.get("head", {}).get("run_id") == head_run_id]
    return hits[-1] if hits else None


@dataclass
class LatencyEvidence:
    """Per (head path, phase): the units behind a latency verdict, and how they were obtained."""

    kind: str  # "paired" | "rounds"
    units: dict[tuple[str, str], Any] = field(default_factory=dict)  # paired: [log ratios]; rounds: (base, head)
    source: str = ""  # a comparison id, or "rounds a/b"
    flagged: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # Components whose work varies per call (random control flow): their units are draws, not judged; key -> why.
    unjudged: dict[tuple[str, str], str] = field(default_factory=dict)
    alpha: float = stats.ALPHA  # the level and floor the verdicts of reports use (a comparison's own)
    floor: float = stats.FLOOR
    # verdicts() per (alpha, floor, units judged): a report asks for them once per section and a page once per
    # use (summary, tables, gate), each a t-test per component.
    _judged: dict[tuple[float, float, int], dict[tuple[str, str], stats.Verdict]] = field(
        default_factory=dict, repr=False, compare=False)

    @property
    def paired(self) -> bool:
        return self.kind == "paired"

    def verdict(self, path: str, phase: str, *, alpha: float = stats.ALPHA, floor: float = stats.FLOOR) -> stats.Verdict | None:
        units = self.units.get((path, phase))
        if units is None:
            return None
        if (path, phase) in self.unjudged:
            return _not_judged(self.unjudged[(path, phase)], units, self.paired)
        return stats.paired(units, alpha=alpha, floor=floor) if self.paired else stats.unpaired(*units, alpha=alpha, floor=floor)

    def family(self, keys: Sequence[tuple[str, str]], *, alpha: float = stats.ALPHA,
               floor: float = stats.FLOOR) -> dict[tuple[str, str], stats.Verdict]:
        """Verdicts of many components judged together (Holm), for a gate rule with a glob."""
        present = {k: self.units[k] for k in keys if k in self.units and k not in self.unjudged}
        left_out = {k: _not_judged(self.unjudged[k], self.units[k], self.paired) for k in keys
                    if k in self.units and k in self.unjudged}
        if not present:
            return left_out
        return {**stats.judge_family(present, alpha=alpha, floor=floor, paired=self.paired), **left_out}

    def verdicts(self, *, alpha: float | None = None, floor: float | None = None) -> dict[tuple[str, str], stats.Verdict]:
        """Every component's verdict on its own (no family correction): what reports list. The level and
        floor default to the evidence's own (a comparison's `--alpha` / `--floor`)."""
        alpha = self.alpha if alpha is None else alpha
        floor = self.floor if floor is None else floor
        memo = (alpha, floor, len(self.units))
        if memo not in self._judged:
            keys = list(self.units)
            if self.paired:
                judged = stats.paired_many([self.units[k] for k in keys], alpha=alpha, floor=floor)
            else:
                judged = stats.unpaired_many([tuple(self.units[k]) for k in keys], alpha=alpha, floor=floor)
            self._judged[memo] = {k: _not_judged(self.unjudged[k], self.units[k], self.paired) if k in self.unjudged else v
                                  for k, v in zip(keys, judged)}
        return dict(self._judged[memo])  # a copy: callers may filter it

    def describe(self) -> str:
        if self.paired:
            return f"paired A/B blocks in worker processes (comparison {self.source})"
        return f"independent runs' rounds ({self.source})"


def from_record(record: Mapping[str, Any]) -> LatencyEvidence:
    """Evidence from a comparison record (its units were computed from its samples when it was made)."""
    ev = LatencyEvidence(kind="paired", source=str(record.get("comparison_id")),
                         alpha=_level(record, "alpha", stats.ALPHA), floor=_level(record, "floor", stats.FLOOR))
    for c in record.get("components", []):
        key = (c["key"], c["phase"])
        if c.get("units") is not None:
            ev.units[key] = [float(u) if u is not None else math.nan for u in c["units"]]
        if c.get("flagged"):
            ev.flagged[key] = list(c["flagged"])
        if isinstance(c.get("not_judged"), str) and c.get("units") is not None:
            ev.unjudged[key] = c["not_judged"]
    return ev


def _not_judged(reason: str, units: Any, paired: bool) -> stats.Verdict:
    """The verdict of a component that is not judged whatever its units say (its work varies per call)."""
    n = len(units) if paired else min(len(units[0]), len(units[1]))
    return stats.Verdict("not judged", None, None, None, None, None, n, None, None, None, reason)


def _level(record: Mapping[str, Any], key: str, default: float) -> float:
    """A record's alpha or floor, or the default where it is missing or not a usable number (archives are untrusted)."""
    value = record.get(key)
    # A floor of 0 is a comparison's own choice (every change judged by significance alone, cli.NUMBERS).
    if (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > 0 or (key == "floor" and value == 0))):
        return float(value)
    return default


def round_log_medians(samples: pl.DataFrame) -> dict[tuple[str, str], list[float]]:
    """(path, phase) -> log of each round's median seconds per call over its uncontended blocks."""
    if samples is None or samples.is_empty():
        return {}
    clean = samples.filter(~pl.col("contended"))
    per_round = clean.group_by(["path", "phase", "round"]).agg(pl.col("seconds_per_call").median().alias("m"))
    out: dict[tuple[str, str], list[float]] = {}
    for row in per_round.sort(["path", "phase", "round"]).iter_rows(named=True):
        if row["m"] and row["m"] > 0:
            out.setdefault((row["path"], row["phase"]), []).append(math.log(row["m"]))
    return out


def from_rounds(base_samples: pl.DataFrame | None, head_samples: pl.DataFrame | None,
                head_to_base: Mapping[str, str], base_rounds: int, head_rounds: int) -> LatencyEvidence | None:
    """Evidence from two independent runs collected with rounds; None unless both have 2 or more."""
    if base_samples is None or head_samples is None or base_rounds < 2 or head_rounds < 2:
        return None
    base = round_log_medians(base_samples)
    head = round_log_medians(head_samples)
    ev = LatencyEvidence(kind="rounds", source=f"{base_rounds} base rounds, {head_rounds} head rounds")
    for (path, phase), h in head.items():
        b = base.get((head_to_base.get(path, path), phase))
        if b is not None:
            ev.units[(path, phase)] = (b, h)
    return ev


def paired_units(samples: pl.DataFrame, layout: str) -> dict[tuple[str, str], list[float]]:
    """The units of a paired session from its samples (columns as schema.SAMPLES_SCHEMA; `key` aligns arms).

    interleaved: per process, the median over its uncontended A/B pairs of log(head/base).
    abba: processes hold one arm each in the order A B B A ...; each neighbour pair (0,1), (2,3), ... gives
    log(median head / median base) over their uncontended blocks.
    """
    if samples.is_empty():
        return {}
    keyed = samples.with_columns(pl.col("key").alias("path"))
    if layout == "interleaved":
        # A pair with a block that waited for a CPU is left out, unless too few clean pairs remain in that
        # process (a machine busy all along): then every pair counts, as both arms shared the waiting,
        # and the t-test sees the larger spread. The record's `flagged` says which.
        group = ["path", "phase", "process"]
        bad = keyed.filter(pl.col("contended")).select(*group, "pair").unique()
        pairs = keyed.select(*group, "pair").unique()
        clean_counts = pairs.join(bad, on=[*group, "pair"], how="anti").group_by(group).agg(pl.len().alias("clean"))
        all_counts = pairs.group_by(group).agg(pl.len().alias("all"))
        busy = (all_counts.join(clean_counts, on=group, how="left").with_columns(pl.col("clean").fill_null(0))
                .filter(pl.col("clean") < pl.min_horizontal(pl.lit(MIN_CLEAN_PAIRS), pl.col("all"))).select(group))
        drop = bad.join(busy, on=group, how="anti")
        clean = keyed.join(drop, on=[*group, "pair"], how="anti")
        table = stats.per_process_log_ratios(clean)
        out: dict[tuple[str, str], list[float]] = {}
        for row in table.sort(["path", "phase", "process"]).iter_rows(named=True):
            out.setdefault((row["path"], row["phase"]), []).append(row["log_ratio"])
        return out
    medians = (keyed.filter(~pl.col("contended")).group_by(["path", "phase", "process", "arm"])
               .agg(pl.col("seconds_per_call").median().alias("m")))
    by: dict[tuple[str, str], dict[int, tuple[str, float]]] = {}
    for row in medians.iter_rows(named=True):
        by.setdefault((row["path"], row["phase"]), {})[row["process"]] = (row["arm"], row["m"])
    out = {}
    for key, procs in by.items():
        ordered = sorted(procs)
        for a, b in zip(ordered[0::2], ordered[1::2]):
            arms = dict([procs[a], procs[b]])
            if "base" in arms and "head" in arms and arms["base"] > 0 and arms["head"] > 0:
                out.setdefault(key, []).append(math.log(arms["head"] / arms["base"]))
    return out


def summary(verdicts: Mapping[Any, stats.Verdict]) -> dict[str, Any]:
    """Counts of each verdict, the median noise (spread of units) and the median detectable change."""
    counts = {v: 0 for v in stats.VERDICTS}
    for v in verdicts.values():
        counts[v.verdict] += 1
    spreads = [v.spread for v in verdicts.values() if v.spread is not None]
    detectable = [v.detectable for v in verdicts.values() if v.detectable is not None]
    return {
        "verdicts": counts,
        "noise_median": statistics.median(spreads) if spreads else None,
        "detectable_median": statistics.median(detectable) if detectable else None,
    }


def evidence_for(root: str | os.PathLike[str] | None, base: Any, head: Any, head_to_base: Mapping[str, str],
                 records: Sequence[Mapping[str, Any]] | None = None) -> LatencyEvidence | None:
    """The best latency evidence for two archived runs: their comparison record, else both runs' rounds.

    `records`: comparison records already read (`list_comparisons`), so a caller judging many pairs reads
    the archive's records once."""
    record: Mapping[str, Any] | None
    if records is None:
        if root is None:
            raise TypeError("evidence_for needs the archive root or the comparison records read from it")
        record = find_comparison(root, base.run_id, head.run_id)
    else:
        hits = [r for r in records if r.get("base", {}).get("run_id") == base.run_id
                and r.get("head", {}).get("run_id") == head.run_id]
        record = hits[-1] if hits else None
    if record is not None:
        return from_record(record)
    return from_rounds(base.samples, head.samples, head_to_base,
                       int(base.meta.get("rounds") or 1), int(head.meta.get("rounds") or 1))
