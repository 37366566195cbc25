"""One RunDiff -> what its page shows: totals with ratios, top contributors, and columnar JSON for the table
and for the icicle of the newer run coloured by delta, one file per phase (`diff_files`: the page loads the first
phase on open and another when asked for, so a 10,000-component diff page stays under 1 MB gzipped).

Shares are given only where they mean something: an additive metric's own change that is a change (never
for a latency change within noise, or one whose verdict is unchanged or inconclusive), and never for peak
memory, whose values are maxima: a peak's own change is the part no child explains, and such parts do not
add up to the model's change (cbsite/diff/rundiff.py), so they are shown as amounts, not as shares.
Nor are shares given where the parts cancel out (`cancelled`): when the components' own changes move, up and
down together, more than CANCEL (cbsite/diff/record.py) times the net change, a share of the net is a large
meaningless number; the page then gives the amounts up, down and net instead.
Latency follows its verdicts when the diff has evidence (cbsite/generator/latencydata.py).
Beside the diff, the page reads from the two runs themselves (`RunFacts`): each listed component's bound on each
side (diffbounds.py), and, for sharded runs, the own changes that would subtract rows of different ranks, which
are not shown as own changes but per rank (diffranks.py).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl

from cbsite import format as cfmt
from cbsite.archive import Run
from cbsite.diff import comparison
from cbsite.diff import rundiff as cdiff
from cbsite.diff.clauses import Clause
from cbsite.diff.record import (
    DIFF_METRICS,
    LABELS,
    NO_SHARE,
    ComponentDelta,
    display_path,
)
from cbsite.diff.summary import capitalise, clause_text, paragraph, total_parts, total_text
from cbsite.generator import charts, latencydata
from cbsite.generator.diffbounds import DiffBounds
from cbsite.generator.diffranks import MixedOwn, mixed_owns
from cbsite.generator.latencydata import Judged, latency_changed, latency_columns
from cbsite.generator.rundata import compact_column, site_bounds

TOP_N = 10
# Metrics with a contributors chart, in the order the page shows them.
CHART_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms")


@dataclass
class RunFacts:
    """What the diff page reads from the two runs beyond their diff: each side's bounds, and the own changes of a
    sharded diff that mix ranks ((path, phase) -> diffranks.MixedOwn). The default knows neither."""

    bounds: DiffBounds = field(default_factory=lambda: DiffBounds(None, None))
    mixed: dict[tuple[str, str], MixedOwn] = field(default_factory=dict)

    @classmethod
    def of(cls, rd: cdiff.RunDiff, base: Run, head: Run) -> RunFacts:
        return cls(DiffBounds(base, head), mixed_owns(rd, base, head))

    def mixes(self, c: ComponentDelta, metric: str) -> bool:
        """The component's own change of `metric` would subtract rows of different ranks: not shown as such."""
        m = self.mixed.get((c.path, c.phase))
        return m is not None and metric in m.metrics

    def know_page(self, side: str, page: dict[str, Any]) -> None:
        """Take `side`'s bounds from its run page's data (rundata.components_json, which the build's worker has
        just computed) instead of reading them again from its rows: the same labels of the same rounded values
        (diffbounds.run_bounds), for the paths that have a row in each phase (status is never null in a row)."""
        for phase in page.get("phases", ()):
            cols = page[phase]
            self.bounds.know(side, phase, {p: b for p, s, b in zip(page["path"], cols["status"], cols["bound"])
                                           if s is not None})

    def own(self, c: ComponentDelta, metric: str) -> float | None:
        """The own change the page shows: None where it would mix ranks."""
        return None if self.mixes(c, metric) else c.self_delta[metric]

    def owns(self, comps: list[ComponentDelta], metric: str) -> list[float | None]:
        """`own` of each of `comps`; without sharded sides (nothing mixes) the own changes as they are."""
        if not self.mixed:
            return [c.self_delta[metric] for c in comps]
        return [self.own(c, metric) for c in comps]

    def unmixed(self, comps: list[ComponentDelta], metric: str) -> list[ComponentDelta]:
        """`comps` without those whose own change of `metric` would mix ranks."""
        return [c for c in comps if not self.mixes(c, metric)] if self.mixed else comps

    def bound_was(self, comps: list[ComponentDelta], phase: str) -> list[str | None]:
        """`bounds.row(c)["bound_was"]` of each of `comps` (all of `phase`), each side's labels looked up once."""
        base, head = self.bounds.side("base", phase), self.bounds.side("head", phase)
        out: list[str | None] = []
        for c in comps:
            if c.kind in ("added", "removed") or c.base_path is None:
                out.append(None)
                continue
            was = base.get(c.base_path)
            out.append(was if was is not None and was != head.get(c.path) else None)
        return out

    def per_rank(self, c: ComponentDelta, metric: str) -> list[str]:
        """Each rank's own change where the all-ranks one mixes ranks: ["rank 0 +1.2 ms", "rank 1 \u22120.4 ms"]."""
        m = self.mixed.get((c.path, c.phase))
        if m is None or metric not in m.metrics:
            return []
        return [f"rank {r} {delta_text(metric, v)}" for r, v in m.per_rank[metric].items()]


NO_FACTS = RunFacts()

UNIT = {"latency_ms": "time", "flops": "flops"}  # the one formatter's kind per metric (format.fmt_signed); else bytes


def delta_text(metric: str, value: float | None) -> str:
    """A change as the page's formatter writes it (format.js `signed`): "+81.4 ns", "\u22121.2 GFLOP", "+12.3 MB";
    "n/a" when unknown (as format.delta, the PR comment's form)."""
    return "n/a" if value is None else cfmt.fmt_signed(value, UNIT.get(metric, "bytes"))


def summary(rd: cdiff.RunDiff, judged: Judged) -> tuple[str, dict[str, Any]]:
    """The diff's summary paragraph and the home page's digest of it (`change_digest`), from one list of clauses,
    with latency as judged (the page's rule)."""
    clauses = rd.clauses(latency=latencydata.root_verdicts(judged, rd), latency_counts=latencydata.latency_counts(judged))
    return paragraph(clauses), change_digest(clauses)


def change_digest(clauses: list[Clause], largest: int = 3) -> dict[str, Any]:
    """A diff's summary clauses (RunDiff.clauses) grouped for the home page's table, every fact of the summary
    kept: `largest`, the latency changes, then the `largest` other totals that moved most ("2.9× forward FLOPs
    (+12.6 MFLOP)"), each group by |ln(head / base)| as the ratio reads; `totals`, the first sentence's other parts in their order
    (smaller changes, "within noise", "unchanged ..."); `notes`, every other clause as a sentence of its own
    without its full stop ("The largest part of the FLOP growth ..."); `regressed`, whether a latency total was
    judged regressed (the home page lists those models first)."""
    if not clauses or clauses[0].kind != "title":
        return {"largest": [], "totals": "", "notes": [paragraph(clauses)] if clauses else [], "regressed": False}
    model = clauses[0].model or "?"
    changed = sorted((c for c in clauses if c.kind == "total" and c.status == "changed"), key=lambda c: -_magnitude(c))
    moved = [c for c in changed if c.metric == "latency_ms"] + [c for c in changed if c.metric != "latency_ms"][:largest]
    shown = {total_text(c) for c in moved}
    rest = [p for p in total_parts(clauses) if p not in shown]
    notes = [capitalise(clause_text(c, model)) for c in clauses if c.kind not in ("title", "total")]
    regressed = any(c.metric == "latency_ms" and c.verdict == "regressed" for c in changed)
    return {"largest": [total_text(c) for c in moved], "totals": ", ".join(rest), "notes": notes, "regressed": regressed}


def _magnitude(c: Clause) -> float:
    """How far a total moved as its ratio reads (format.change_as_written): |ln(head / base)|, infinite from
    nothing; totals whose ratios read the same keep the summary's order."""
    ratio = cfmt.change_as_written(c.base, c.head)
    return abs(math.log(ratio)) if ratio is not None and ratio > 0 else math.inf


def cancelled(rd: cdiff.RunDiff, metric: str, phase: str) -> dict[str, Any] | None:
    """When the own changes of `metric` cancel out in `phase` (up and down together more than CANCEL times the net
    change, or a net of zero with parts that moved): the amounts up, down and net as the page writes them, else
    None. Shares of such a net mean nothing ("2000000%"), so none are given for it."""
    cancel = rd.cancelled(metric, phase)
    if cancel is None:
        return None
    return {"up": delta_text(metric, cancel.up), "down": delta_text(metric, cancel.down),
            "net": delta_text(metric, cancel.net), "complete": cancel.complete}


def totals_rows(rd: cdiff.RunDiff, judged: Judged | None = None) -> list[dict[str, Any]]:
    """One row per (phase, metric) for the totals table, with the ratio already in words.

    With latency evidence, a latency row's direction is its root verdict's (regressed up, improved down,
    anything else no change) and the row carries that verdict; without, no direction. `judgement` is the word
    every report prints for latency (comparison.judgement), None for the other metrics."""
    rows = []
    for phase, metrics in rd.totals.items():
        for metric in DIFF_METRICS:
            t = metrics[metric]
            direction = 0 if not t.delta or t.noise else (1 if t.delta > 0 else -1)
            verdict, judgement = None, None
            if metric == "latency_ms" and judged is not None and judged.judged:
                v = judged.get("", phase)
                verdict = v.to_dict() if v is not None else None
                direction = {"regressed": 1, "improved": -1}.get(v.verdict if v is not None else "", 0)
                judgement = comparison.judgement(v, judged.floor) if v is not None else "not judged"
            elif metric == "latency_ms":  # one story: unjudged latency is no finding (comparison.NOT_JUDGED)
                direction, judgement = 0, comparison.NOT_JUDGED
            rows.append({
                "phase": phase, "metric": metric, "label": LABELS[metric],
                "base": None if t.base is None else cfmt.amount(metric, t.base),
                "head": None if t.head is None else cfmt.amount(metric, t.head),
                "delta": cfmt.delta(metric, t.delta), "ratio": cfmt.change(t.base, t.head),
                "noise": t.noise, "complete": t.complete, "direction": direction, "verdict": verdict,
                "judgement": judgement,
            })
    return rows


def _changes(rd: cdiff.RunDiff, metric: str, phase: str, judged: Judged | None,
             facts: RunFacts = NO_FACTS) -> list[ComponentDelta]:
    """The components with an own change of `metric` that counts, largest first (as `RunDiff.top` orders
    them); latency with evidence counts only components whose verdict is a change. An own change that would mix
    ranks (`RunFacts.mixes`) is not one."""
    if metric != "latency_ms" or judged is None or not judged.judged:
        return facts.unmixed(rd.top(metric, phase, len(rd.components)), metric)
    rows = [(i, c) for i, c in enumerate(rd.for_phase(phase))
            if c.self_delta[metric] not in (None, 0) and latency_changed(c, judged) and not facts.mixes(c, metric)]
    # rows hold known own changes only (None was filtered out above)
    rows.sort(key=lambda ic: (-abs(cast(float, ic[1].self_delta[metric])), -ic[1].depth, ic[0]))
    return [c for _, c in rows]


def _change_word(c: ComponentDelta, value: float) -> str:
    """What happened to the metric itself: a component classified `increased` by its FLOPs may have got
    faster, so the word follows the sign of this metric's change, not the component's kind."""
    if c.kind in ("added", "removed", "moved"):
        return c.kind
    return "grew" if value > 0 else "shrank"


def top_rows(rd: cdiff.RunDiff, model: str, judged: Judged | None = None,
             facts: RunFacts = NO_FACTS) -> dict[str, list[dict[str, Any]]]:
    """The deepest components that explain each metric's change in the main phase."""
    phase = "forward" if "forward" in rd.totals else (rd.phases[0] if rd.phases else None)
    if phase is None:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for metric in CHART_METRICS:
        rows = []
        cancel = cancelled(rd, metric, phase)
        for c in _changes(rd, metric, phase, judged, facts)[:TOP_N]:
            value = cast(float, c.self_delta[metric])  # `_changes` lists known own changes only
            rows.append({
                "path": display_path(c.path, model), "label": display_path(c.path, model),
                "module_type": c.module_type, "kind": c.kind, "delta": value, "change": _change_word(c, value),
                "share": None if metric in NO_SHARE or cancel else c.share[metric],
                "delta_text": delta_text(metric, value), "cancel": cancel,
            })
        if rows:
            out[metric] = rows
    return out


ANSWER_N = 5  # latency changes per phase the page leads with; the table and the verdicts list the rest
ANSWER_GROWTH_N = 3  # FLOP and peak-memory changes per phase
ANSWER_MIXED_N = 3  # latency changes per phase whose own change would mix ranks, listed with each rank's
# An ancestor whose own change is less than this part of its change is its children's change again: folded
# into them (a leaf's own change is its whole change, so it is always kept).
FOLD = 0.5


def _folded(c: ComponentDelta, metric: str) -> bool:
    own, whole = c.self_delta[metric], c.delta[metric]
    return own is None or whole is None or abs(own) < FOLD * abs(whole)


def answer(rd: cdiff.RunDiff, model: str, judged: Judged | None = None,
           facts: RunFacts = NO_FACTS) -> list[dict[str, Any]]:
    """What the diff page leads with, per phase (backward as well as forward): the latency changes that count
    (judged ones where the diff has evidence, else those outside noise), largest own change in ms first, with
    the verdict's ratio and interval, the absolute medians per forward and the component's bound (the newer
    side's, "memory \u2192 compute" where it changed); then the FLOP and peak-memory changes. An ancestor whose
    change is its children's (`FOLD`) is not listed again.

    `mixed`: the latency changes that count whose own change would mix ranks (a sharded diff: `RunFacts.mixes`),
    largest change first, each with every rank's own change in its place."""
    judged = judged or Judged(None, None)
    out = []
    for phase in rd.phases:
        latency: list[dict[str, Any]] = []
        for c in _changes(rd, "latency_ms", phase, judged, facts):
            if len(latency) == ANSWER_N:
                break
            if _folded(c, "latency_ms"):
                continue
            latency.append(_latency_row(c, model, judged, facts) | {"own": delta_text("latency_ms", c.self_delta["latency_ms"])})
        mixed = sorted((c for c in rd.for_phase(phase) if facts.mixes(c, "latency_ms") and _latency_counts(c, judged)),
                       key=lambda c: -abs(c.delta["latency_ms"] or 0))[:ANSWER_MIXED_N] if facts.mixed else []
        growth = {}
        for metric in ("flops", "peak_memory_bytes"):
            rows = list(itertools.islice((c for c in _changes(rd, metric, phase, None, facts)
                                          if not _folded(c, metric)), ANSWER_GROWTH_N))
            if rows:
                growth[metric] = [{"label": display_path(c.path, model), "kind": c.kind,
                                   "own": delta_text(metric, c.self_delta[metric])} for c in rows]
        out.append({"phase": phase, "latency": latency, "growth": growth,
                    "mixed": [_latency_row(c, model, judged, facts) | {
                        "change": delta_text("latency_ms", c.delta["latency_ms"]),
                        "per_rank": facts.per_rank(c, "latency_ms")} for c in mixed]})
    return out


def _latency_counts(c: ComponentDelta, judged: Judged) -> bool:
    """The component's latency change counts (its verdict, or without evidence its noise rule)."""
    return c.delta["latency_ms"] not in (None, 0) and latency_changed(c, judged)


def _latency_row(c: ComponentDelta, model: str, judged: Judged, facts: RunFacts) -> dict[str, Any]:
    v = judged.get(c.path, c.phase) if judged.judged else None
    return {
        "label": display_path(c.path, model), "module_type": c.module_type, "kind": c.kind,
        "base": c.base["latency_ms"], "head": c.head["latency_ms"],
        "verdict": v.verdict if v is not None else (c.kind if c.kind in ("added", "removed") else None),
        "ratio": v.ratio if v is not None else None,
        "ci_low": v.ci_low if v is not None else None, "ci_high": v.ci_high if v is not None else None,
        **facts.bounds.row(c),
    }


def with_bounds(latency: dict[str, Any], rd: cdiff.RunDiff, facts: RunFacts) -> dict[str, Any]:
    """The latency verdicts' context (latencydata.latency_context) with each listed component's bound
    (diffbounds.DiffBounds.row) on its rows."""
    listed = latency.get("listed")
    if not listed:
        return latency
    at = {(c.path, c.phase): c for c in rd.components}
    rows = []
    for r in listed:
        c = at.get((r.get("path"), r.get("phase")))
        rows.append(r | (facts.bounds.row(c) if c is not None else {"bound": None, "bound_was": None, "bound_text": None}))
    return latency | {"listed": rows}


def default_colour(rd: cdiff.RunDiff, judged: Judged | None = None) -> str:
    """The icicle's colouring on open: the metric whose whole-model change is largest (|ln head/base|) among
    the changes that count (latency only where its verdict, or without evidence its noise rule, says so)."""
    judged = judged or Judged(None, None)
    best, metric = 0.0, "flops"
    for phase, totals in rd.totals.items():
        root = next((c for c in rd.for_phase(phase) if c.path == ""), None)
        for m in ("flops", "param_bytes", "peak_memory_bytes", "latency_ms"):
            t = totals[m]
            if not t.base or not t.head or t.base <= 0 or t.head <= 0 or t.noise:
                continue
            if m == "latency_ms" and (root is None or not latency_changed(root, judged)):
                continue
            size = abs(math.log(t.head / t.base))
            if size > best:
                best, metric = size, m
    return "delta_" + metric


def ties(tops: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    """Per metric, how many of the top rows share the first row's own change exactly (a tie is named as one)."""
    out = {}
    for metric, rows in tops.items():
        n = sum(1 for r in rows if r["delta"] == rows[0]["delta"])
        if n > 1:
            out[metric] = n
    return out


# The x axis of a contributors chart names the unit only: its title says what is drawn (a title repeated on the
# axis is cut short where the chart is narrow).
AXIS_UNIT = {"flops": "FLOP", "param_bytes": "bytes", "peak_memory_bytes": "bytes", "latency_ms": "ms",
             "bytes_moved": "bytes"}
LABEL_LIMIT = 220  # px for a bar's label; the bars keep the rest of the chart's width


def short_labels(paths: list[str]) -> list[str]:
    """Each dotted path's last segments, as few as keep the labels distinct, after "…" where cut:
    "…embedding_bags.t_cat_0", "…_mlp.1._linear" (the whole path is in the tooltip)."""
    parts = [p.split(".") for p in paths]
    keep = [1] * len(paths)
    while True:
        labels = [".".join(ps[-k:]) for ps, k in zip(parts, keep)]
        seen: dict[str, list[int]] = {}
        for i, label in enumerate(labels):
            seen.setdefault(label, []).append(i)
        clash = [i for ids in seen.values() if len(ids) > 1 for i in ids if keep[i] < len(parts[i])]
        if not clash:
            break
        for i in clash:
            keep[i] += 1
    # A parent's segment too where the last one alone says little ("…_mlp.1._linear", not "…_linear"), and never
    # starting at a list index ("…_mlp.0._linear", not "…0._linear").
    keep = [max(k, min(2, len(ps))) for ps, k in zip(parts, keep)]
    for i, ps in enumerate(parts):
        while keep[i] < len(ps) and ps[-keep[i]].isdigit():
            keep[i] += 1
    return [("\u2026" if k < len(ps) else "") + ".".join(ps[-k:]) for ps, k in zip(parts, keep)]


def chart_specs(tops: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The contributors charts: bars labelled by the paths' last segments (whole paths in the tooltip), the x axis
    named by its unit and reading 0 at zero (never "0M"). The rows' `cancel` note is the page's, not the chart's."""
    out = {}
    for metric, rows in tops.items():
        labels = short_labels([r["path"] for r in rows])
        data = [{**{k: v for k, v in r.items() if k != "cancel"}, "label": label} for r, label in zip(rows, labels)]
        spec = charts.contributors_spec(
            data, f"Own change: {LABELS[metric]}" + (" (ms)" if metric == "latency_ms" else ""),
            charts.AXIS_FORMAT[metric])
        spec["encoding"]["x"]["title"] = AXIS_UNIT.get(metric, "")
        spec["encoding"]["x"]["axis"]["labelExpr"] = "datum.value == 0 ? '0' : datum.label"
        spec["encoding"]["y"]["axis"]["labelLimit"] = LABEL_LIMIT
        out[metric] = spec
    return out


def _shares(rd: cdiff.RunDiff, phase: str, metric: str, judged: Judged | None,
            facts: RunFacts = NO_FACTS) -> list[float | None]:
    comps = rd.for_phase(phase)
    if metric in NO_SHARE or cancelled(rd, metric, phase):
        return [None] * len(comps)
    if metric == "latency_ms":
        judged = judged or Judged(None, None)
        return [c.share[metric] if latency_changed(c, judged) and not facts.mixes(c, metric) else None for c in comps]
    if not facts.mixed:
        return [c.share[metric] for c in comps]
    return [None if facts.mixes(c, metric) else c.share[metric] for c in comps]


def _floats(values: list[Any]) -> list[Any]:
    """Integers (FLOPs, bytes) as floats, so that they are rounded too; whole results are written as integers."""
    return [float(v) if type(v) is int else v for v in values]


def _whole(values: list[Any]) -> list[Any]:
    """Whole floats written as integers ("344000000000", not "344000000000.0")."""
    return [int(v) if type(v) is float and v.is_integer() and abs(v) < 2 ** 53 else v for v in values]


# What the diff page reads (assets/diffpage.js), and no more: a 10,000-component diff must stay small (under
# 1 MB gzipped with its page, tests/test_page_bytes.py). Base and head values only for latency (the icicle's
# tooltip); other metrics' values are on the runs' pages. Shares only where the table shows them.
SIDE_METRICS = ("latency_ms",)
SHARE_METRICS = ("flops", "param_bytes", "latency_ms")  # peak memory has none (NO_SHARE); bytes moved no column
DIGITS = 3  # deltas and shares as the one formatter prints them (cbsite/format.py: 3 significant digits)
# The head run's own columns the icicle draws and its tooltip reads (assets/runicicle.js), per call as
# the run page's components.json has them, aligned with the diff's rows; `bound` is computed as rundata does.
RUN_COLUMNS = ("status", "error", "latency_ms", "flops", "peak_memory_bytes", "mfu", "bandwidth_util", "bytes_moved")
PHASE_FILE = "diff.{phase}.json"

_EXACT = 2 ** 53  # integers below this are exact as floats
_INT, _INT_OR_NONE = frozenset({int}), frozenset({int, type(None)})
_POW10 = np.array([10 ** k for k in range(19)], dtype=np.int64)


def rounded(values: list[Any], digits: int = DIGITS) -> list[Any]:
    """`_whole(compact_column(_floats(values), digits))`: each number to `digits` significant digits, whole results
    as integers. The same values in a fraction of the time: the integers below 2**53 (FLOPs, bytes: exact as
    floats) are rounded together in integer arithmetic (`_round_ints`), where formatting each as a float and
    parsing it back is slow for large ones; the other values go the float way."""
    types = set(map(type, values))
    if types <= _INT_OR_NONE:  # FLOPs and bytes: a column of integers, some unknown
        known = values if types == _INT else [v for v in values if v is not None]
        if known and -_EXACT < min(known) and max(known) < _EXACT:
            whole = _round_ints(known, digits)
            if len(known) == len(values):
                return whole
            it = iter(whole)
            return [None if v is None else next(it) for v in values]
    exact = [type(v) is int and -_EXACT < v < _EXACT for v in values]
    if not any(exact):
        return _whole(compact_column(_floats(values), digits))
    ints = iter(_round_ints([v for v, e in zip(values, exact) if e], digits))
    others = iter(_whole(compact_column(_floats([v for v, e in zip(values, exact) if not e]), digits)))
    return [next(ints) if e else next(others) for e in exact]


def _round_ints(values: list[int], digits: int) -> list[int | float]:
    """What `"%.{digits}g" % v` reads back as, written whole (`_whole`), for integers |v| < 2**53: each rounded to
    `digits` significant digits, a tie to the even last digit (as float formatting rounds the exact value)."""
    v = np.fromiter(values, dtype=np.int64, count=len(values))
    a = np.abs(v)
    # searchsorted: how many digits each has; scale: 10 ** the digits dropped
    scale = _POW10[np.maximum(np.searchsorted(_POW10, a, side="right") - digits, 0)]
    q, r = np.divmod(a, scale)
    a = (q + ((2 * r > scale) | ((2 * r == scale) & (q % 2 == 1)))) * scale
    out: list[int | float] = np.where(v < 0, -a, a).tolist()
    if int(a.max(initial=0)) >= _EXACT:  # rounded up to 2**53 or more: a float, as _whole leaves it
        out = [x if -_EXACT < x < _EXACT else float(x) for x in out]
    return out


def encode_paths(paths: list[str]) -> tuple[list[int], list[str]]:
    """Paths as (parent row, last segment): the parent is the row of the path's prefix when an earlier row has
    it (-1 otherwise, and then the segment is the whole path); the root `""` is (-1, ""). The browser joins
    them back (diffpage.js `decodePaths`); a 10,000-path column shrinks to a quarter, gzipped."""
    seen: dict[str, int] = {}
    parent: list[int] = []
    name: list[str] = []
    for i, path in enumerate(paths):
        cut = path.rfind(".")
        prefix = path[:cut] if cut >= 0 else ("" if path else None)
        k = seen.get(prefix, -1) if prefix is not None else -1
        parent.append(k)
        name.append(path[cut + 1:] if k >= 0 else path)
        seen.setdefault(path, i)
    return parent, name


def decode_paths(parent: list[int], name: list[str]) -> list[str]:
    """The inverse of `encode_paths` (diffpage.js does the same)."""
    out: list[str] = []
    for k, n in zip(parent, name):
        out.append(n if k < 0 else (out[k] + "." + n if out[k] else n))
    return out


def _run_columns(head: Run, phase: str, comps: list[ComponentDelta],
                 page: dict[str, Any] | None = None) -> dict[str, Any]:
    """The head run's per-call values of `phase` for each diff row (null for a removed component), compacted as
    the run page's (rundata.compact_column), with the static `call_count` and `param_bytes`.

    `page`: the head run's page data (rundata.components_json), when the caller has it (the build's worker that
    just computed it): its compacted columns and bounds are taken instead of computed again. They are the same
    values: a diff's run has one row per path in each phase (cbsite.diff.rundiff refuses a path twice), compacting is per
    value, and the bound is read from the same compacted values (tests/test_build_speed_diff.py)."""
    if page is not None and phase in page.get("phases", ()) and isinstance(page.get(phase), dict):
        at_page = {p: i for i, p in enumerate(page["path"])}
        where = [at_page.get(c.path, -1) if c.kind != "removed" else -1 for c in comps]
        have = page[phase]
        rows = head.rows.filter(pl.col("phase") == phase).select("path", "call_count", "param_bytes")
        static = {c: dict(zip(rows.get_column("path").to_list(), rows.get_column(c).to_list()))
                  for c in ("call_count", "param_bytes")}
        cols = {c: compact_column([static[c].get(comp.path) if k >= 0 else None for comp, k in zip(comps, where)])
                for c in ("call_count", "param_bytes")}
        for c in (*RUN_COLUMNS, "bound"):
            column = have[c]
            cols[c] = [column[k] if k >= 0 else None for k in where]
        return cols
    wanted = ["path", "call_count", "param_bytes", "device_time_ms", *RUN_COLUMNS]
    rows = head.rows.filter(pl.col("phase") == phase).sort("order")
    if "kind" in rows.columns:  # a sharded run: its communicating rows are labelled so, as on its run page
        wanted.append("kind")
    raw = {c: rows.get_column(c).to_list() if c in rows.columns else [None] * rows.height for c in wanted}
    at = {p: i for i, p in enumerate(raw["path"])}  # a path's last row wins, as in rundata.components_json
    where = [at.get(c.path, -1) if c.kind != "removed" else -1 for c in comps]
    cols = {c: compact_column([raw[c][k] if k >= 0 else None for k in where]) for c in wanted[1:]}
    # The run page's labels (suspect above a peak, communication), so both paths to these columns agree.
    cols["bound"] = site_bounds(cols)
    cols.pop("device_time_ms")
    cols.pop("kind", None)
    return cols


def diff_files(rd: cdiff.RunDiff, judged: Judged | None = None, head: Run | None = None,
               page: dict[str, Any] | None = None, facts: RunFacts = NO_FACTS) -> dict[str, dict[str, Any]]:
    """The diff page's data files by name: `diff.json`, a small index the page loads first (phases, whether
    latency is judged, the file of each phase), and one `diff.<phase>.json` per phase. The page loads its
    first phase on open and another only when asked for (its table's or icicle's phase selector), so what a
    10,000-component diff moves on open is one phase.

    A phase file's columns, aligned row by row: the path as `parent`/`name` (`encode_paths`), `base_path`
    (null where the component kept its path), `module_type`, `depth`, `kind`, `missing`, latency `base` and
    `head` per forward, `delta` and `own` (self_delta) of each metric, `share` of those the table shows, `noise`, `latency` (only
    when the diff has evidence: the verdict columns of latencydata) and `run`: the head run's own values of
    the phase that the icicle draws (`_run_columns`; none without `head`; `page`: the head run's page data, when
    at hand). From `facts`: `bound_was`, the older side's bound where it differs from the newer's (null elsewhere);
    and in a sharded diff `mixed`, per row null or, for each metric whose own change would mix ranks (its `own`
    null then), each rank's own change {metric: {rank: change}}."""
    judged = judged or Judged(None, None)
    files: dict[str, dict[str, Any]] = {}
    index: dict[str, Any] = {"metrics": list(DIFF_METRICS), "phases": rd.phases, "judged": judged.judged,
                             "files": {}}
    if head is not None:
        index["model"] = head.model
    for phase in rd.phases:
        comps = rd.for_phase(phase)
        parent, name = encode_paths([c.path for c in comps])
        cols: dict[str, Any] = {
            "parent": parent, "name": name,
            "base_path": [c.base_path if c.base_path != c.path else None for c in comps],
            "module_type": [c.module_type for c in comps],
            "depth": [c.depth for c in comps],
            "kind": [c.kind for c in comps],
            "missing": [list(c.missing) for c in comps],
        }
        for key in ("base", "head"):
            dicts = [getattr(c, key) for c in comps]
            cols[key] = {m: compact_column([d[m] for d in dicts]) for m in SIDE_METRICS}
        deltas = [c.delta for c in comps]
        cols["delta"] = {m: rounded([d[m] for d in deltas]) for m in DIFF_METRICS}
        # The icicle colours a node by its own change, so a regressed leaf shows where its ancestors' sums hide it.
        cols["own"] = {m: rounded(facts.owns(comps, m)) for m in DIFF_METRICS}
        cols["share"] = {m: compact_column(_shares(rd, phase, m, judged, facts), DIGITS) for m in SHARE_METRICS}
        if facts.mixed:
            cols["mixed"] = [_per_rank_column(facts.mixed.get((c.path, phase))) for c in comps]
        noise = [c.noise for c in comps]
        cols["noise"] = {m: [d[m] for d in noise] for m in DIFF_METRICS}
        latency = latency_columns(judged, comps)
        if latency is not None:
            cols["latency"] = latency
        if head is not None:
            cols["run"] = _run_columns(head, phase, comps, page)
            if facts.bounds.runs["head"] is not None:  # the head run's labels, read once (run_bounds reads the same)
                facts.bounds.know("head", phase, {c.path: b for c, b in zip(comps, cols["run"]["bound"])
                                                  if c.kind != "removed"})
        if facts.bounds.runs["base"] is not None:
            cols["bound_was"] = facts.bound_was(comps, phase)
        file = PHASE_FILE.format(phase=phase)
        index["files"][phase] = file
        files[file] = cols
    return {"diff.json": index, **files}


def _per_rank_column(m: MixedOwn | None) -> dict[str, dict[str, Any]] | None:
    if m is None:
        return None
    return {metric: {str(r): v for r, v in zip(ranks, rounded(list(ranks.values())))}
            for metric, ranks in m.per_rank.items()}


def read_diff(folder: str | Path) -> dict[str, Any]:
    """A diff page's data files (`diff_files`, as written in `folder`) as one object, every phase in it with its
    paths written out: for scripts and tests that want the whole diff's columns at once."""
    folder = Path(folder)
    out = json.loads((folder / "diff.json").read_text())
    for phase, file in out.pop("files").items():
        cols = json.loads((folder / file).read_text())
        cols["path"] = decode_paths(cols.pop("parent"), cols.pop("name"))
        out[phase] = cols
    return out
