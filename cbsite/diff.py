"""Align two runs component by component, classify each change and attribute it to submodules.

One implementation serves the site's diff pages and the CLI's `cbsite diff`, PR summary and gate.
Pure data: polars rows in, dataclasses out; presentation lives elsewhere.

The rules
---------
* **Alignment.** Components are aligned by `path` within each phase. Only phases present in both runs
  are compared; a phase present in one run only is named in `RunDiff.warnings`. With
  `match_moved=True`, components present on one side only are also matched by structure
  (see `_match_moved`) and reported as `moved`; components whose paths match are never moved.
* **Per-forward totals.** Every value compared is a total per forward of the whole model:
  per-call value x `call_count` for the per-call metrics (FLOPs, latency, bytes moved), with
  `call_count == 0` (a container that is never called) counted as 1, so a module called twice counts
  twice. `param_bytes` is static (the unique parameters of the subtree) and is never multiplied.
  `peak_memory_bytes` is a maximum, not a sum, and is never multiplied either.
* **Attribution (additive metrics: FLOPs, latency, bytes moved, parameter bytes).** A component's own
  share on one side is its total minus the totals of its children on that side; its `self_delta` is
  own(head) - own(base) (an absent side counts 0). With unchanged structure this is exactly
  "delta minus the sum of the children's deltas", so delta = sum of children's deltas + self_delta;
  with moved components it still credits the old and new parent correctly. Over a phase the
  self_deltas telescope to the root's delta, so `share = self_delta / root delta` sums to 1
  (None when the root delta is 0 or unknown). Rows are used as stored: an estimated container holds
  its children's sums (own share 0); a measured container's own share is its number minus its
  children's. Float own shares within 1e-9 (relative) of zero are rounding and are snapped to 0.
* **Attribution (peak memory).** Peaks do not add up, so a component's `self_delta` is the part of its
  peak change that no single child shows: delta minus the largest child delta in the same direction,
  clipped between 0 and delta. A change planted in one leaf is then owned by that leaf alone, and the
  ancestors that merely inherit it get 0 (with self_delta = delta every ancestor would tie with the
  leaf and crowd `top()`). `share = self_delta / root delta`; these shares do not sum to 1 and may
  exceed 1, since any one of several components can explain the same peak.
* **Shares in words** (`summary`). A share is written only where it means something: never for peak
  memory (NO_SHARE), never where the own changes cancel out (`RunDiff.cancelled`: up and down together
  above CANCEL x |net|; the diff page uses the same rule), and only between 0 % and 100 %; otherwise the
  amounts. A clause never starts with a path, so no path is ever capitalised.
* **Missing values.** A value that is missing (None: failed or skipped component, metric not
  measured) on a side where the component exists is never read as 0: the delta is None, the metric is
  listed in `ComponentDelta.missing`, and the own share of its parent on that side is unknown too
  (None). A total that excludes such a value has `Total.complete == False`.
* **Noise (latency).** The spread of a component is its per-forward IQR width (p75 - p25, times calls);
  a component without percentiles (an estimated container) takes the sum of its children's widths,
  an upper bound that errs towards "noise" so the gate never fails on what could be noise. A latency
  change is noise when |delta| <= base width + head width; noise is never a change.
* **Classification** of a component present on both sides: the first metric of `DIFF_METRICS`
  (flops, param_bytes, peak_memory_bytes, latency_ms, bytes_moved) whose delta is a change decides
  `increased` or `decreased`; a change is any difference of integer counts (FLOPs, bytes), or
  |delta| > 1e-9 x max(|base|, |head|) for floats (less is rounding), and, for latency, not noise.
  So a component whose FLOPs went up and latency went down is `increased` (exact counts come before
  timings). Metrics that are None on a side are skipped by the classification; `missing`
  says which. Nothing changed: `unchanged`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import polars as pl

from cbsite import schema
from cbsite.archive import Run
from cbsite.errors import CbsiteError

# Order matters: it is the classification order (exact counts first, timings last) and the column order.
DIFF_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms", "bytes_moved")
KINDS = ("added", "removed", "increased", "decreased", "unchanged", "moved")

PER_CALL_METRICS = frozenset({"flops", "latency_ms", "bytes_moved"})  # per-forward = per-call x calls
ADDITIVE_METRICS = frozenset({"flops", "latency_ms", "bytes_moved", "param_bytes"})  # own = total - children
REL_TOL = 1e-9  # below this relative difference two values are the same number

LABELS = {
    "flops": "FLOPs",
    "param_bytes": "parameter memory",
    "peak_memory_bytes": "peak memory",
    "latency_ms": "latency",
    "bytes_moved": "bytes moved",
}
# Singular form used in "the FLOP growth".
_GROWTH_LABELS = {**LABELS, "flops": "FLOP"}
MINUS = "\u2212"  # typographic minus, as in "−12%"
# Peak memory is a maximum: own changes do not add up to the model's, so no share of it is ever given.
NO_SHARE = frozenset({"peak_memory_bytes"})
# Own changes up and down above CANCEL x |net change|: the parts cancel out and no share of the net is given (a
# share of -32 B net read "2000000%" on the committed dlrm-sharded diff). The one definition, for the summary and
# for the diff page (cbsite/generator/diffdata.py).
CANCEL = 4.0


@dataclass(frozen=True)
class Total:
    """One metric of the whole model (the root's per-forward total) in one phase, base vs head."""

    metric: str
    base: float | None
    head: float | None
    delta: float | None
    ratio: float | None  # head / base; None when base is 0 or a side is unknown
    noise: bool  # latency only: |delta| within the combined IQR of the two roots
    complete: bool = True  # False when some component lacks this metric, so the total excludes it


@dataclass(frozen=True)
class ComponentDelta:
    """One aligned component in one phase. Values are per-forward totals (see the module docstring)."""

    path: str
    phase: str
    module_type: str
    depth: int
    kind: str  # one of KINDS
    base_path: str | None  # path in base; differs from `path` only when moved; None when added
    base: dict[str, float | None]
    head: dict[str, float | None]
    delta: dict[str, float | None]  # head - base; an absent side counts 0 (added/removed)
    self_delta: dict[str, float | None]  # the component's own part of the delta
    share: dict[str, float | None]  # self_delta / the root's delta of the metric
    noise: dict[str, bool]  # latency change within the combined IQR (False for other metrics)
    status_base: str | None
    status_head: str | None
    missing: tuple[str, ...] = ()  # metrics without a value on a side where the component exists

    @property
    def flagged(self) -> bool:
        """True when some delta is unknown because a value is missing (failed or skipped component)."""
        return bool(self.missing)


@dataclass(frozen=True)
class Cancelled:
    """Own changes of one metric in one phase that cancel out: the sums up (>= 0), down (<= 0) and the net.
    `complete` is False when some component's own change is unknown, so up + down need not equal net."""

    up: float
    down: float
    net: float
    complete: bool


@dataclass
class RunDiff:
    """The comparison of two runs: totals per phase and every aligned component."""

    base_meta: dict[str, Any]
    head_meta: dict[str, Any]
    totals: dict[str, dict[str, Total]]  # phase -> metric -> Total
    components: list[ComponentDelta]  # phase by phase, each in pre-order of head (removed where they were)
    warnings: list[str] = field(default_factory=list)
    # Sharded runs: collective bytes per communicating component (cbsite/traffic.py TrafficDelta); [] otherwise.
    traffic: list[Any] = field(default_factory=list)
    # Answers of for_phase, top and cancelled, which the site and the summary ask for a dozen times each over the
    # same components (issue 14: each walked all of them); kept while `components` is the same list of the same
    # length (a diff's components are not changed once made).
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def _remembered(self, key: Any, compute: Any) -> Any:
        stamp = (id(self.components), len(self.components))
        if self._memo.get("stamp") != stamp:
            self._memo.clear()
            self._memo["stamp"] = stamp
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def phases(self) -> list[str]:
        """The phases compared, in schema order."""
        return list(self.totals)

    def for_phase(self, phase: str) -> list[ComponentDelta]:
        """The components of one phase, in pre-order."""
        self._check_phase(phase)
        return list(self._remembered(("phase", phase), lambda: [c for c in self.components if c.phase == phase]))

    def get(self, path: str, phase: str = "forward") -> ComponentDelta:
        """The component at `path` (its head path; base path for a removed one) in `phase`."""
        for c in self.components:
            if c.phase == phase and c.path == path:
                return c
        raise CbsiteError(f"no component {path!r} in the {phase} diff; paths are torch FQNs, the root is ''")

    def top(self, metric: str, phase: str = "forward", n: int = 10,
            counts: Callable[[ComponentDelta], bool] | None = None) -> list[ComponentDelta]:
        """The `n` components with the largest |self_delta| of `metric`: the deepest ones that explain it.

        Components with no own change, an unknown one, or a latency change within noise are left out.
        `counts`: where latency was judged, whether a component's change counts (review.latency_changed: its
        verdict), instead of the within-run noise rule. Ties go to the deeper component, then to pre-order.
        """
        _check_metric(metric)

        def ranked() -> list[ComponentDelta]:
            rows = [
                (i, c)
                for i, c in enumerate(self.for_phase(phase))
                if c.self_delta[metric] not in (None, 0) and (counts(c) if counts is not None else not c.noise[metric])
            ]
            rows.sort(key=lambda ic: (-abs(ic[1].self_delta[metric]), -ic[1].depth, ic[0]))
            return [c for _, c in rows]

        if counts is not None:
            return ranked()[:n]
        return self._remembered(("top", metric, phase), ranked)[:n]

    def cancelled(self, metric: str, phase: str = "forward") -> Cancelled | None:
        """The own changes of `metric` in `phase` when they cancel out (up and down together more than CANCEL
        times the net change, or a net of zero with parts that moved), else None. Shares of such a net mean
        nothing ("2000000%"), so none are given for it. Peak memory (NO_SHARE) never cancels: it has no shares."""
        _check_metric(metric)
        if metric in NO_SHARE or phase not in self.totals:
            return None
        return self._remembered(("cancelled", metric, phase), lambda: self._cancelled(metric, phase))

    def _cancelled(self, metric: str, phase: str) -> Cancelled | None:
        net = self.totals[phase][metric].delta
        comps = self.for_phase(phase)
        parts = [c.self_delta[metric] for c in comps if c.self_delta[metric] is not None]
        up = sum(v for v in parts if v > 0)
        down = sum(v for v in parts if v < 0)
        if net is None or up - down == 0 or up - down <= CANCEL * abs(net):
            return None
        # With unknown values (failed, skipped components) the known parts need not add up to the net change.
        complete = len(parts) == len(comps) and abs(up + down - net) <= 1e-6 * (up - down)
        return Cancelled(up=up, down=down, net=net, complete=complete)

    def counts(self, phase: str = "forward") -> dict[str, int]:
        """How many components of each kind (every kind present, in KINDS order) in `phase`."""
        self._check_phase(phase, compared_only=False)
        counts = dict.fromkeys(KINDS, 0)
        for c in self.components:
            if c.phase == phase:
                counts[c.kind] += 1
        return counts

    def summary(self, latency: dict[str, str] | None = None,
                latency_counts: Callable[[ComponentDelta], bool] | None = None) -> str:
        """One plain-text paragraph in words: totals with ratios, where the change is, counts, warnings.

        `latency` (phase -> the whole model's latency verdict, `cbsite.stats`), when latency was judged: a
        total is then a change only where its verdict is regressed or improved, unchanged where it is
        unchanged, and named inconclusive otherwise; without it the within-run IQR rule (noise) decides.
        `latency_counts` does the same for components (review.latency_changed): where a latency change is,
        is then said of components whose verdict is a change, as the diff page draws them.
        Components that tie for the largest part of a change are named as a tie, never one of them alone.
        """
        base_model, head_model = self.base_meta.get("model", "?"), self.head_meta.get("model", "?")
        model = head_model
        title = (
            f"{model} {self.head_meta.get('version', '?')} vs {self.base_meta.get('version', '?')}"
            if base_model == head_model
            else f"{head_model} {self.head_meta.get('version', '?')} vs {base_model} {self.base_meta.get('version', '?')}"
        )
        if not self.totals:
            return f"{title}: no phase in common, nothing compared. " + " ".join(w + "." for w in self.warnings)
        main = "forward" if "forward" in self.totals else self.phases[0]

        changed: list[str] = []
        same: list[str] = []
        noisy: list[str] = []
        unknown: list[str] = []
        undecided: list[str] = []
        # Parameter memory is static: say it once, not per phase.
        items = [("param_bytes", main, LABELS["param_bytes"])]
        for phase in self.phases:
            for metric in ("flops", "peak_memory_bytes", "latency_ms"):
                items.append((metric, phase, f"{phase} {LABELS[metric]}"))
        for metric, phase, label in items:
            total = self.totals[phase][metric]
            verdict = (latency or {}).get(phase) if metric == "latency_ms" else None
            if verdict in ("regressed", "improved") and total.delta is not None:
                changed.append(f"{format_ratio(total)} {label} ({format_delta(metric, total.delta)}, {verdict})")
            elif verdict == "unchanged":
                same.append(label)
            elif verdict is not None:
                undecided.append(f"{label} ({verdict})")
            elif total.delta is None:
                unknown.append(label)
            elif total.noise:
                noisy.append(f"{label} ({format_delta(metric, total.delta)})")
            elif _is_change(metric, total.base, total.head, total.delta):
                changed.append(f"{format_ratio(total)} {label} ({format_delta(metric, total.delta)})")
            else:
                same.append(label)
        parts = list(changed)
        if noisy:
            parts.append(f"{', '.join(noisy)} within noise")
        if same:
            parts.append(f"unchanged {', '.join(same)}")
        if unknown:
            parts.append(f"unknown {', '.join(unknown)}")
        parts.extend(undecided)
        sentences = [f"{title}: {', '.join(parts)}."]

        where = []
        # FLOPs, parameters and peak memory where the main phase says (backward FLOPs grow where forward ones do);
        # latency in every phase, since backward often moves for other reasons and by more (dlrm v2's +4.51 ms
        # backward beside +0.156 ms forward was once explained by the forward alone). With two phases each
        # clause names its phase.
        named = len(self.phases) > 1
        checks = [(m, main) for m in ("flops", "param_bytes", "peak_memory_bytes")] + [("latency_ms", p) for p in self.phases]
        for metric, phase in checks:
            total = self.totals[phase][metric]
            if total.delta in (None, 0) or not _is_change(metric, total.base, total.head, total.delta):
                continue
            if metric == "latency_ms":
                verdict = (latency or {}).get(phase)
                if verdict not in ("regressed", "improved") if verdict is not None else total.noise:
                    continue
            in_phase = phase if named and metric != "param_bytes" else None
            counts = latency_counts if metric == "latency_ms" else None
            if (clause := self._where(metric, phase, total, model, in_phase, counts)) is not None:
                where.append(clause)
        if where:
            # Every clause starts with a word of ours, never a path: a path is never capitalised.
            sentences.append(_capitalise("; ".join(where)) + ".")

        counts = self.counts(main)
        listed = [f"{counts[k]} {k}" for k in KINDS if counts[k]]
        sentences.append(f"{_capitalise(main)} components: {', '.join(listed)}.")

        flagged = sorted({display_path(c.path, model) for c in self.components if c.flagged})
        if flagged:
            shown = ", ".join(flagged[:5]) + (f" and {len(flagged) - 5} more" if len(flagged) > 5 else "")
            sentences.append(
                f"{len(flagged)} component{'s' * (len(flagged) != 1)} lack numbers in a run "
                f"(failed, skipped or not measured), so some deltas are unknown: {shown}."
            )
        from cbsite.throughput import sentence

        if (step := sentence(self.base_meta, self.head_meta)) is not None:
            sentences.append(step)
        sentences.extend(_capitalise(w) + "." for w in self.warnings)
        return " ".join(sentences)

    def _where(self, metric: str, phase: str, total: Total, model: str, in_phase: str | None = None,
               counts: Callable[[ComponentDelta], bool] | None = None) -> str | None:
        """Where a total's change is, in one clause that starts with a word, never with a path.

        Shares are given only where they mean something: between 0 and 100 %, never for peak memory (a
        maximum, see NO_SHARE) and never where the own changes cancel out (`cancelled`); otherwise amounts.
        `in_phase`: the phase the clause names ("the backward latency growth"), None to name none."""
        label = (f"{in_phase} " if in_phase else "") + _GROWTH_LABELS[metric]
        what = f"{label} {'growth' if total.delta > 0 else 'reduction'}"
        if (cancel := self.cancelled(metric, phase)) is not None:
            return (f"{(in_phase + ' ') if in_phase else ''}{LABELS[metric]}: own changes cancel out ({format_delta(metric, cancel.up)} up, "
                    f"{format_delta(metric, cancel.down)} down, {format_delta(metric, cancel.net)} net"
                    + ("" if cancel.complete else "; some own changes unknown") + ")")
        # The largest own change in the direction of the total: a component that moved the other way is an
        # offset, not where the growth is.
        growing = total.delta > 0
        best = [c for c in self.top(metric, phase, len(self.components), counts) if (c.self_delta[metric] > 0) == growing]
        if not best:
            return None
        c, own = best[0], best[0].self_delta[metric]
        name = display_path(c.path, model) + (" (own)" if c.path == "" else "")
        tied = [t for t in best if t.self_delta[metric] == own]
        share = None if metric in NO_SHARE else c.share[metric]
        if len(tied) > 1:
            names = [display_path(t.path, model) for t in tied]
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            if share is not None and _pct_fits(share * len(tied)):
                each = f"{_pct(share)} each, {_pct(share * len(tied))} together"
            else:
                each = f"{format_delta(metric, own)} each"
            if share is None:
                return f"{len(tied)} components tie for the largest own {what} ({each}): {shown}"
            return f"{len(tied)} components tie for the largest part of the {what} ({each}): {shown}"
        if share is None:
            # Peaks are maxima: say whose own peak moved most, with its amount and no percentage.
            return f"the largest own {what} is in {name} ({_short_type(c.module_type)}, {format_delta(metric, own)})"
        if not _pct_fits(share):
            return (f"the largest own {what} is in {name} ({format_delta(metric, own)}, more than the whole "
                    f"model's {format_delta(metric, total.delta)}: partly offset elsewhere)")
        if share >= 0.5:
            return f"most of the {what} ({_pct(share)}) is in {name} ({_short_type(c.module_type)})"
        return f"the largest part of the {what} ({_pct(share)}) is in {name}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with a stable key order (insertion order; no NaN or infinity)."""
        return {
            "base": _identity(self.base_meta),
            "head": _identity(self.head_meta),
            "phases": self.phases,
            "warnings": list(self.warnings),
            "summary": self.summary(),
            "counts": {phase: self.counts(phase) for phase in self.phases},
            "totals": {
                phase: {
                    m: {
                        "base": _json(t.base),
                        "head": _json(t.head),
                        "delta": _json(t.delta),
                        "ratio": _json(t.ratio),
                        "noise": t.noise,
                        "complete": t.complete,
                    }
                    for m, t in metrics.items()
                }
                for phase, metrics in self.totals.items()
            },
            "components": [
                {
                    "path": c.path,
                    "base_path": c.base_path,
                    "phase": c.phase,
                    "module_type": c.module_type,
                    "depth": c.depth,
                    "kind": c.kind,
                    "status_base": c.status_base,
                    "status_head": c.status_head,
                    "missing": list(c.missing),
                    **{
                        key: {m: _json(getattr(c, key)[m]) for m in DIFF_METRICS}
                        for key in ("base", "head", "delta", "self_delta", "share")
                    },
                    "noise": {m: c.noise[m] for m in DIFF_METRICS},
                }
                for c in self.components
            ],
        }

    def _check_phase(self, phase: str, compared_only: bool = True) -> None:
        if phase not in schema.PHASES:
            raise CbsiteError(f"unknown phase {phase!r}: use one of {', '.join(schema.PHASES)}")
        if compared_only and phase not in self.totals:
            raise CbsiteError(
                f"the {phase} phase was not compared (compared: {', '.join(self.phases) or 'none'}); "
                "collect both runs with that phase"
            )


# --- entry points ------------------------------------------------------------------------------


def diff_runs(base: Run, head: Run, *, match_moved: bool = False) -> RunDiff:
    """Compare two runs: `head` (the newer) against `base`. See the module docstring for the rules."""
    return diff_tables(base.rows, head.rows, match_moved=match_moved, base_meta=base.meta, head_meta=head.meta)


def diff_tables(
    base_rows: pl.DataFrame,
    head_rows: pl.DataFrame,
    *,
    match_moved: bool = False,
    base_meta: dict[str, Any] | None = None,
    head_meta: dict[str, Any] | None = None,
) -> RunDiff:
    """Compare two tables of component rows (the components.parquet schema); metadata is optional."""
    base_meta = base_meta if base_meta is not None else _meta_from_rows(base_rows)
    head_meta = head_meta if head_meta is not None else _meta_from_rows(head_rows)
    base_sides = _sides(base_rows, "base", base_meta)
    head_sides = _sides(head_rows, "head", head_meta)
    phases = [p for p in schema.PHASES if p in base_sides and p in head_sides]
    warnings = _warnings(base_meta, head_meta, base_sides, head_sides)
    if not phases:
        raise CbsiteError(
            f"the runs have no phase in common (base: {', '.join(base_sides) or 'none'}; "
            f"head: {', '.join(head_sides) or 'none'}); collect both with the same phases"
        )
    # Moves are matched once, on the forward structure when there is one, and applied to every phase,
    # so a component is moved in both phases or in neither.
    moved: dict[str, str] = {}
    if match_moved:
        moved = _match_moved(base_sides[phases[0]], head_sides[phases[0]])

    totals: dict[str, dict[str, Total]] = {}
    components: list[ComponentDelta] = []
    for phase in phases:
        phase_totals, phase_components = _diff_phase(phase, base_sides[phase], head_sides[phase], moved)
        totals[phase] = phase_totals
        components.extend(phase_components)
    from cbsite import traffic  # sharded runs' collective bytes (traffic.py formats with this module)

    return RunDiff(base_meta=base_meta, head_meta=head_meta, totals=totals, components=components, warnings=warnings,
                   traffic=[t for t in traffic.diff_traffic(base_rows, head_rows) if t.phase in phases])


# --- formatting shared by the summary, the site and the CLI ------------------------------------


def format_ratio(total: Total) -> str:
    """A total's change in words: "2.8×" from double up, "+39%", "−12%", "±0%", "new", or "n/a"."""
    base, head = total.base, total.head
    if base is None or head is None:
        return "n/a"
    if base == 0:
        return "±0%" if head == 0 else "new"
    ratio = head / base
    if ratio >= 2:
        return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"
    return _signed_pct(ratio - 1)


def format_delta(metric: str, value: float | None) -> str:
    """A signed change with its unit: "+12.3 MB", "−1.2 GFLOP", "+0.0123 ms"; "n/a" when unknown."""
    if value is None:
        return "n/a"
    sign = "+" if value > 0 else (MINUS if value < 0 else "±")
    return sign + format_amount(metric, abs(value))


def format_amount(metric: str, value: float) -> str:
    """A value with its unit: FLOPs and bytes with decimal SI prefixes, latency in ms."""
    if metric in ("latency_ms",):
        return f"{_sig3(value)} ms"
    unit = "FLOP" if metric == "flops" else "B"
    prefixes = ["", "k", "M", "G", "T", "P", "E"]
    i = 0
    while i < len(prefixes) - 1 and abs(float(_sig3(value))) >= 1000:
        value /= 1000
        i += 1
    return f"{_sig3(value)} {prefixes[i]}{unit}"


def display_path(path: str, model: str) -> str:
    """The root is shown with the model's name; every other component with its FQN."""
    return path if path else model


# --- one run's phase, as columns ----------------------------------------------------------------

# Columns the diff reads; everything else in a row is presentation.
_COLUMNS = ("path", "parent", "phase", "order", "status", "call_count", "module_type", "param_count",
            "latency_p25_ms", "latency_p75_ms") + DIFF_METRICS
# Integer sums below this (and their differences) stay exact in int64 and in float64, so numpy gives what Python's integers give, to the bit
# (sums, differences and true divisions alike); an archive with larger numbers takes the plain-Python path.
_EXACT = float(2 ** 52)


class _Side:
    """One run's phase in pre-order: structure as plain lists indexed by pre-order position (`_union` and
    `_match_moved` walk them), and per-forward totals, own shares and IQR widths as numpy columns (`numbers`), so a
    diff of 1,000 components takes milliseconds (issue 14: a 1,000-run site computes a thousand of them).

    `total`, `own` and `width` are the same numbers as plain lists (None for missing), computed the first time they
    are asked for: the reference that the numpy path reproduces bit for bit (tests/test_diff_fast.py), and the path
    taken where numpy could not (integers beyond 2**53, a metric of another type; see `numbers`).
    """

    def __init__(self, rows: pl.DataFrame, broken: Any) -> None:
        rows = rows.sort("order")
        self.rows = rows
        n = rows.height
        col = {c: rows.get_column(c).to_list() for c in ("path", "parent", "module_type", "status", "param_count")}
        self.path: list[str] = col["path"]
        self.name = [p.rsplit(".", 1)[-1] for p in self.path]
        self.module_type: list[str] = col["module_type"]
        self.status: list[str] = col["status"]
        self.param_count: list[int | None] = col["param_count"]
        self.index: dict[str, int] = {}
        for i, p in enumerate(self.path):
            if p in self.index:
                raise broken(f"component {p!r} appears twice")
            self.index[p] = i
        if n == 0 or self.path[0] != "":
            raise broken("the root component (path '') is missing or not first in `order`")
        self.parent = [-1] * n
        self.depth = [0] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, pp in enumerate(col["parent"]):
            if i == 0:
                continue
            j = self.index.get(pp, -1) if pp is not None else -1
            if not 0 <= j < i:  # pre-order: a parent comes before its children
                raise broken(f"component {self.path[i]!r} names parent {pp!r}, which has no row before it")
            self.parent[i] = j
            self.depth[i] = self.depth[j] + 1
            self.children[j].append(i)
        self._lists: tuple[Any, Any, Any] | None = None
        self._numbers: Any = False  # not computed yet

    # --- the numbers as plain lists (the reference) ---

    @property
    def total(self) -> dict[str, list[Any]]:
        return self._reference()[0]

    @property
    def own(self) -> dict[str, list[Any]]:
        return self._reference()[1]

    @property
    def width(self) -> list[float | None]:
        return self._reference()[2]

    def _reference(self) -> tuple[Any, Any, Any]:
        if self._lists is None:
            self._lists = self._compute_lists()
        return self._lists

    def _compute_lists(self) -> tuple[Any, Any, Any]:
        n = len(self.path)
        col = {c: self.rows.get_column(c).to_list()
               for c in ("call_count", "latency_p25_ms", "latency_p75_ms") + DIFF_METRICS}
        calls = [max(c or 0, 1) for c in col["call_count"]]  # a never-called container counts once
        totals: dict[str, list[Any]] = {}
        for m in DIFF_METRICS:
            values = [None if v is None or v != v else v for v in col[m]]  # NaN is missing too
            if m in PER_CALL_METRICS:
                values = [None if v is None else v * c for v, c in zip(values, calls)]
            totals[m] = values

        # Own share = total - children's totals; unknown when any of them is unknown.
        owns: dict[str, list[Any]] = {}
        for m in ADDITIVE_METRICS:
            total = totals[m]
            rest: list[Any] = [0] * n
            unknown = [False] * n
            for i in range(n - 1, 0, -1):
                if total[i] is None:
                    unknown[self.parent[i]] = True
                else:
                    rest[self.parent[i]] += total[i]
            own: list[Any] = [None] * n
            for i in range(n):
                if total[i] is None or unknown[i]:
                    continue
                o = total[i] - rest[i]
                if isinstance(o, float) and abs(o) <= REL_TOL * max(abs(total[i]), abs(rest[i])):
                    o = 0.0  # rounding of an estimated container's float sum, not a share
                own[i] = o
            owns[m] = own

        # Per-forward latency spread; a node without percentiles (an estimate) takes the sum of its
        # children's, an upper bound.
        p25, p75 = col["latency_p25_ms"], col["latency_p75_ms"]
        width: list[float | None] = [None] * n
        kids_width = [0.0] * n
        kids_unknown = [False] * n
        for i in range(n - 1, -1, -1):
            if p25[i] is not None and p75[i] is not None:
                width[i] = (p75[i] - p25[i]) * calls[i]
            elif self.children[i] and not kids_unknown[i]:
                width[i] = kids_width[i]
            if i:
                if width[i] is None:
                    kids_unknown[self.parent[i]] = True
                else:
                    kids_width[self.parent[i]] += width[i]  # type: ignore[operator]
        return totals, owns, width

    # --- the same numbers as numpy columns ---

    def numbers(self) -> _Numbers | None:
        """The numbers as numpy columns; None where they would not be bit for bit the reference's: a metric
        neither integer nor float, or integers whose sums reach 2**53."""
        if self._numbers is False:
            self._numbers = _Numbers.of(self)
        return self._numbers


@dataclass
class _Numbers:
    """A side's per-forward totals, own shares and latency widths as numpy columns, with masks of the unknown
    ones. Sums run in the reference's order (children in reverse pre-order), so float results are the same bits."""

    total: dict[str, np.ndarray]
    total_missing: dict[str, np.ndarray]
    own: dict[str, np.ndarray]
    own_missing: dict[str, np.ndarray]
    width: np.ndarray
    width_missing: np.ndarray

    @staticmethod
    def of(side: _Side) -> _Numbers | None:
        rows, n = side.rows, len(side.path)
        # Series.to_numpy, not polars' own null handling: each polars operation on a Series costs a query (some
        # 0.1 ms; they were a third of a diff's time).
        calls_col = _array(rows.get_column("call_count"))
        if calls_col is None or calls_col[0].dtype.kind != "i":
            return None
        calls = np.maximum(calls_col[0], 1)  # a never-called container (or none recorded) counts once
        parent = np.asarray(side.parent, dtype=np.int64)
        rev = np.arange(n - 1, 0, -1)  # every child, in reverse pre-order
        total: dict[str, np.ndarray] = {}
        total_missing: dict[str, np.ndarray] = {}
        for m in DIFF_METRICS:
            column = _array(rows.get_column(m))
            if column is None:
                return None
            values, missing = column
            if values.dtype.kind == "f":
                missing = missing | np.isnan(values)  # NaN is missing too
            if values.dtype.kind == "i":
                size = np.abs(values.astype(np.float64))
                if (size * calls if m in PER_CALL_METRICS else size).sum() >= _EXACT:
                    return None
            if m in PER_CALL_METRICS:
                values = values * calls
            values = np.where(missing, np.zeros(1, dtype=values.dtype), values)
            total[m], total_missing[m] = values, missing

        own: dict[str, np.ndarray] = {}
        own_missing: dict[str, np.ndarray] = {}
        for m in ADDITIVE_METRICS:
            t, miss = total[m], total_missing[m]
            unknown = np.zeros(n, dtype=bool)
            unknown[parent[rev[miss[rev]]]] = True
            known = rev[~miss[rev]]
            rest = np.zeros(n, dtype=t.dtype)
            np.add.at(rest, parent[known], t[known])  # one by one, in this order: the reference's sums
            o = t - rest
            if o.dtype.kind == "f":
                # rounding of an estimated container's float sum, not a share
                o[np.abs(o) <= REL_TOL * np.maximum(np.abs(t), np.abs(rest))] = 0.0
            own[m], own_missing[m] = o, miss | unknown

        # Per-forward latency spread, level by level from the deepest: a node without percentiles takes the sum
        # of its children's widths (all one level below it), added in reverse pre-order as the reference does.
        p25s, p75s = _array(rows.get_column("latency_p25_ms")), _array(rows.get_column("latency_p75_ms"))
        if p25s is None or p75s is None:
            return None
        has = ~(p25s[1] | p75s[1])  # percentiles present (a NaN is present, and gives a NaN width, as in the reference)
        width = np.where(has, (p75s[0].astype(np.float64) - p25s[0]) * calls, 0.0)
        width_missing = ~has
        has_kids = np.bincount(parent[1:], minlength=n)[:n] > 0 if n > 1 else np.zeros(n, dtype=bool)
        kids_width = np.zeros(n)
        kids_unknown = np.zeros(n, dtype=bool)
        depth = np.asarray(side.depth, dtype=np.int64)
        by_depth = depth[rev]
        for d in range(int(depth.max()), 0, -1):
            level = rev[by_depth == d]  # this level's nodes, in reverse pre-order
            est = level[~has[level]]
            ok = has_kids[est] & ~kids_unknown[est]
            width[est[ok]] = kids_width[est[ok]]
            width_missing[est] = ~ok
            miss = width_missing[level]
            kids_unknown[parent[level[miss]]] = True
            np.add.at(kids_width, parent[level[~miss]], width[level[~miss]])
        if not has[0]:
            if has_kids[0] and not kids_unknown[0]:
                width[0], width_missing[0] = kids_width[0], False
            else:
                width_missing[0] = True
        return _Numbers(total, total_missing, own, own_missing, width, width_missing)


def _array(column: pl.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """A numeric column as numpy: int64 (integers) or float64 values, 0 where null, and the nulls' mask; None for
    a column of another type, or integers that a float64 would not hold exactly."""
    n = column.len()
    if column.dtype == pl.Null:
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    nulls = column.null_count()
    if column.dtype.is_integer():
        values = column.to_numpy()  # float64 with NaN for the nulls when there are any
        if not nulls:
            if values.dtype.kind == "u" and n and values.max() >= 2 ** 62:
                return None
            return values.astype(np.int64, copy=False), np.zeros(n, dtype=bool)
        missing = np.isnan(values)
        values = np.where(missing, 0.0, values)
        if n and np.abs(values).max() >= _EXACT:
            return None
        return values.astype(np.int64), missing
    if column.dtype.is_float():
        values = column.to_numpy().astype(np.float64, copy=False)
        if not nulls:
            return values, np.zeros(n, dtype=bool)
        missing = column.is_null().to_numpy()
        return np.where(missing, 0.0, values), missing
    return None


def _sides(rows: pl.DataFrame, side: str, meta: dict[str, Any]) -> dict[str, _Side]:
    absent = sorted(set(_COLUMNS) - set(rows.columns))
    if absent:
        raise CbsiteError(f"the {side} rows lack columns {absent}; are they components.parquet rows?")
    where = f"{meta.get('model', '?')}@{meta.get('version', '?')} ({meta.get('run_id', '?')})"

    def broken(problem: str) -> CbsiteError:
        return CbsiteError(f"the {side} run {where} has a broken component tree: {problem}; collect it again")

    by_phase = rows.select(_COLUMNS).partition_by("phase", as_dict=True)
    return {phase: _Side(by_phase[(phase,)], broken) for phase in schema.PHASES if (phase,) in by_phase}


# --- one phase ---------------------------------------------------------------------------------


def _diff_phase(
    phase: str, base: _Side, head: _Side, moved_paths: dict[str, str]
) -> tuple[dict[str, Total], list[ComponentDelta]]:
    head_to_base = {i: base.index[p] for i, p in enumerate(head.path) if p in base.index}
    moved = set()
    for hp, bp in moved_paths.items():
        if hp in head.index and bp in base.index:
            head_to_base[head.index[hp]] = base.index[bp]
            moved.add(head.index[hp])
    pairs = _union(base, head, head_to_base)
    bn, hn = base.numbers(), head.numbers()
    if bn is not None and hn is not None and all(bn.total[m].dtype == hn.total[m].dtype for m in DIFF_METRICS):
        return _diff_phase_numpy(phase, base, head, bn, hn, pairs, moved)
    return _diff_phase_reference(phase, base, head, pairs, moved)


_new = object.__new__


def _diff_phase_numpy(phase: str, base: _Side, head: _Side, bn: _Numbers, hn: _Numbers,
                      pairs: list[tuple[int, int, int, int]], moved: set[int]) -> tuple[dict[str, Total], list[ComponentDelta]]:
    """`_diff_phase_reference` on numpy columns: the same results, bit for bit (tests/test_diff_fast.py)."""
    n = len(pairs)
    table = np.array(pairs, dtype=np.int64).reshape(n, 4)
    h_at, b_at, parent = table[:, 0], table[:, 1], table[:, 3]
    on_h, on_b = h_at >= 0, b_at >= 0
    h_i, b_i = np.where(on_h, h_at, 0), np.where(on_b, b_at, 0)
    both = on_h & on_b

    def side_values(num: dict[str, np.ndarray], miss: dict[str, np.ndarray], m: str, at: np.ndarray,
                    on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # an absent side counts 0 ... a missing value never does
        v = num[m][at]
        return np.where(on, v, np.zeros(1, dtype=v.dtype)), miss[m][at] & on

    delta: dict[str, np.ndarray] = {}
    delta_missing: dict[str, np.ndarray] = {}
    bvals: dict[str, list[Any]] = {}
    hvals: dict[str, list[Any]] = {}
    own: dict[str, np.ndarray] = {}
    own_missing: dict[str, np.ndarray] = {}
    for m in DIFF_METRICS:
        hv, hm = side_values(hn.total, hn.total_missing, m, h_i, on_h)
        bv, bm = side_values(bn.total, bn.total_missing, m, b_i, on_b)
        delta[m], delta_missing[m] = hv - bv, hm | bm
        hvals[m] = _with_none(hv, hm | ~on_h)
        bvals[m] = _with_none(bv, bm | ~on_b)
        if m in ADDITIVE_METRICS:
            oh, ohm = side_values(hn.own, hn.own_missing, m, h_i, on_h)
            ob, obm = side_values(bn.own, bn.own_missing, m, b_i, on_b)
            own[m], own_missing[m] = oh - ob, ohm | obm
            if own[m].dtype.kind == "f":
                # Each side's own share is rounded to 0 against that side's totals (_compute_lists), so one side
                # may round and the other not; a self delta within rounding of the larger total is no change.
                own[m][np.abs(own[m]) <= REL_TOL * np.maximum(np.abs(hv), np.abs(bv))] = 0.0

    # Peak memory: the part of the change that no single child shows (module docstring).
    d, dm = delta["peak_memory_bytes"], delta_missing["peak_memory_bytes"]
    zero = np.zeros(n, dtype=d.dtype)
    up, down = zero.copy(), zero.copy()
    kids = np.flatnonzero(~dm & (parent >= 0))
    np.maximum.at(up, parent[kids], d[kids])
    np.minimum.at(down, parent[kids], d[kids])
    own["peak_memory_bytes"] = d - np.where(d > 0, np.minimum(up, d), np.where(d < 0, np.maximum(down, d), zero))
    own_missing["peak_memory_bytes"] = dm

    dl, dlm = delta["latency_ms"], delta_missing["latency_ms"]
    width_known = ~bn.width_missing[b_i] & ~hn.width_missing[h_i]
    latency_noise = (both & ~dlm & (dl != 0) & width_known
                     & (np.abs(dl) <= bn.width[b_i] + hn.width[h_i]))

    totals: dict[str, Total] = {}
    root_delta: dict[str, Any] = {}
    for m in DIFF_METRICS:
        b_root = None if bn.total_missing[m][0] else bn.total[m][0].item()
        h_root = None if hn.total_missing[m][0] else hn.total[m][0].item()
        root_delta[m] = None if delta_missing[m][0] else delta[m][0].item()
        totals[m] = Total(
            metric=m,
            base=b_root,
            head=h_root,
            delta=root_delta[m],
            ratio=h_root / b_root if b_root not in (None, 0) and h_root is not None else None,
            noise=bool(latency_noise[0]) if m == "latency_ms" else False,
            complete=not delta_missing[m].any(),
        )

    # Classification: the first metric whose delta is a change decides (`_classify`, `_is_change`).
    kind = np.full(n, "unchanged", dtype=object)
    kind[~on_b] = "added"
    kind[~on_h] = "removed"
    if moved:
        kind[both & np.isin(h_at, list(moved))] = "moved"
    open_ = both & (kind == "unchanged")
    for m in DIFF_METRICS:
        dv = delta[m]
        change = ~delta_missing[m] & (dv != 0)
        if m == "latency_ms":
            change &= ~latency_noise
        if dv.dtype.kind == "f":
            hv, bv = hn.total[m][h_i], bn.total[m][b_i]
            change &= np.abs(dv) > REL_TOL * np.maximum(np.abs(bv), np.abs(hv))
        decided = open_ & change
        kind[decided & (dv > 0)] = "increased"
        kind[decided & (dv < 0)] = "decreased"
        open_ &= ~decided

    gaps = np.zeros(n, dtype=bool)
    for m in DIFF_METRICS:
        gaps |= delta_missing[m]
    missing: list[tuple[str, ...]] = [()] * n
    for k in np.flatnonzero(gaps).tolist():
        missing[k] = tuple(m for m in DIFF_METRICS if delta_missing[m][k])

    deltas = [_with_none(delta[m], delta_missing[m]) for m in DIFF_METRICS]
    selfs = [_with_none(own[m], own_missing[m]) for m in DIFF_METRICS]
    shares = []
    for m in DIFF_METRICS:
        rd = root_delta[m]
        if not rd:
            shares.append([None] * n)
        else:
            shares.append(_with_none(own[m] / rd, own_missing[m]))
    noise_lists = [latency_noise.tolist() if m == "latency_ms" else [False] * n for m in DIFF_METRICS]
    metrics = DIFF_METRICS

    h_list, b_list, depth_list = h_at.tolist(), b_at.tolist(), table[:, 2].tolist()
    kind_list = kind.tolist()
    components = []
    for k, (h, b, depth, bv, hv, dv, sv, shv, nv) in enumerate(zip(
            h_list, b_list, depth_list, zip(*(bvals[m] for m in metrics)), zip(*(hvals[m] for m in metrics)),
            zip(*deltas), zip(*selfs), zip(*shares), zip(*noise_lists))):
        side, i = (head, h) if h >= 0 else (base, b)
        c = _new(ComponentDelta)  # what the dataclass's __init__ sets, without its per-field object.__setattr__
        c.__dict__.update(
            path=side.path[i],
            phase=phase,
            module_type=side.module_type[i],
            depth=depth,
            kind=kind_list[k],
            base_path=base.path[b] if b >= 0 else None,
            base=dict(zip(metrics, bv)),
            head=dict(zip(metrics, hv)),
            delta=dict(zip(metrics, dv)),
            self_delta=dict(zip(metrics, sv)),
            share=dict(zip(metrics, shv)),
            noise=dict(zip(metrics, nv)),
            status_base=base.status[b] if b >= 0 else None,
            status_head=head.status[h] if h >= 0 else None,
            missing=missing[k],
        )
        components.append(c)
    return totals, components


def _with_none(values: np.ndarray, missing: np.ndarray) -> list[Any]:
    """A numpy column as a list of Python ints or floats, with None where `missing`."""
    out = values.tolist()
    for k in np.flatnonzero(missing).tolist():
        out[k] = None
    return out


def _diff_phase_reference(phase: str, base: _Side, head: _Side, pairs: list[tuple[int, int, int, int]],
                          moved: set[int]) -> tuple[dict[str, Total], list[ComponentDelta]]:
    n = len(pairs)
    delta: dict[str, list[Any]] = {m: [None] * n for m in DIFF_METRICS}
    own: dict[str, list[Any]] = {m: [None] * n for m in DIFF_METRICS}
    latency_noise = [False] * n
    missing: list[tuple[str, ...]] = [()] * n
    # Largest child peak change in each direction, gathered children first (reverse pre-order).
    up: list[Any] = [0] * n
    down: list[Any] = [0] * n
    for k in range(n - 1, -1, -1):
        h, b, _, parent = pairs[k]
        gaps = []
        for m in DIFF_METRICS:
            hv = head.total[m][h] if h >= 0 else 0  # an absent side counts 0 ...
            bv = base.total[m][b] if b >= 0 else 0
            if hv is None or bv is None:  # ... a missing value never does
                gaps.append(m)
            else:
                delta[m][k] = hv - bv
        missing[k] = tuple(gaps)
        for m in ADDITIVE_METRICS:
            oh = head.own[m][h] if h >= 0 else 0
            ob = base.own[m][b] if b >= 0 else 0
            o = None if oh is None or ob is None else oh - ob
            hv = head.total[m][h] if h >= 0 else 0
            bv = base.total[m][b] if b >= 0 else 0
            if isinstance(o, float) and abs(o) <= REL_TOL * max(abs(hv or 0), abs(bv or 0)):
                o = 0.0  # within rounding of the larger side's total: no change (as _diff_phase_numpy)
            own[m][k] = o
        d = delta["peak_memory_bytes"][k]
        if d is not None:
            # Peak memory: the part of the change that no single child shows (module docstring).
            own["peak_memory_bytes"][k] = d - (min(up[k], d) if d > 0 else max(down[k], d) if d < 0 else 0)
            if parent >= 0:
                up[parent], down[parent] = max(up[parent], d), min(down[parent], d)
        dl = delta["latency_ms"][k]
        if h >= 0 and b >= 0 and dl:
            width = _add(base.width[b], head.width[h])
            latency_noise[k] = width is not None and abs(dl) <= width

    totals: dict[str, Total] = {}
    for m in DIFF_METRICS:
        b_root, h_root, d = base.total[m][0], head.total[m][0], delta[m][0]
        totals[m] = Total(
            metric=m,
            base=b_root,
            head=h_root,
            delta=d,
            ratio=h_root / b_root if b_root not in (None, 0) and h_root is not None else None,
            noise=latency_noise[0] if m == "latency_ms" else False,
            complete=not any(m in gaps for gaps in missing),
        )

    components = []
    absent = dict.fromkeys(DIFF_METRICS)
    for k, (h, b, depth, _) in enumerate(pairs):
        side, i = (head, h) if h >= 0 else (base, b)
        noise = {m: latency_noise[k] if m == "latency_ms" else False for m in DIFF_METRICS}
        d = {m: delta[m][k] for m in DIFF_METRICS}
        bvals = {m: base.total[m][b] for m in DIFF_METRICS} if b >= 0 else dict(absent)
        hvals = {m: head.total[m][h] for m in DIFF_METRICS} if h >= 0 else dict(absent)
        if b < 0:
            kind = "added"
        elif h < 0:
            kind = "removed"
        elif h in moved:
            kind = "moved"
        else:
            kind = _classify(bvals, hvals, d, noise)
        components.append(
            ComponentDelta(
                path=side.path[i],
                phase=phase,
                module_type=side.module_type[i],
                depth=depth,
                kind=kind,
                base_path=base.path[b] if b >= 0 else None,
                base=bvals,
                head=hvals,
                delta=d,
                self_delta={m: own[m][k] for m in DIFF_METRICS},
                share={
                    m: own[m][k] / totals[m].delta if own[m][k] is not None and totals[m].delta else None
                    for m in DIFF_METRICS
                },
                noise=noise,
                status_base=base.status[b] if b >= 0 else None,
                status_head=head.status[h] if h >= 0 else None,
                missing=missing[k],
            )
        )
    return totals, components


def _classify(base: dict[str, Any], head: dict[str, Any], delta: dict[str, Any], noise: dict[str, bool]) -> str:
    """The first metric of DIFF_METRICS that changed decides (see the module docstring)."""
    for m in DIFF_METRICS:
        if delta[m] is None or noise[m]:
            continue
        if _is_change(m, base[m], head[m], delta[m]):
            return "increased" if delta[m] > 0 else "decreased"
    return "unchanged"


def _is_change(metric: str, base: float | None, head: float | None, delta: float | None) -> bool:
    """Integer counts differ when they differ; floats when |delta| > REL_TOL x the larger magnitude
    (below that it is rounding, e.g. of an estimated container's float sums)."""
    if delta is None or delta == 0:
        return False
    if isinstance(delta, int):
        return True
    scale = max(abs(base or 0), abs(head or 0))
    return abs(delta) > REL_TOL * scale


def _union(base: _Side, head: _Side, head_to_base: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The union tree in pre-order as (head index, base index, depth, parent position), -1 for absent:
    head's order, each removed component right after its predecessor among its base siblings."""
    matched_base = set(head_to_base.values())
    out: list[tuple[int, int, int, int]] = []
    stack = [(0, 0, 0, -1)]
    while stack:
        h, b, depth, parent = stack.pop()
        me = len(out)
        out.append((h, b, depth, parent))
        head_kids = head.children[h] if h >= 0 else []
        base_kids = base.children[b] if b >= 0 else []
        kids = [(k, head_to_base.get(k, -1)) for k in head_kids]
        if base_kids:
            position = {head_to_base[k]: i for i, k in enumerate(head_kids) if k in head_to_base}
            after: dict[int, list[int]] = {}
            anchor = -1
            for k in base_kids:
                if k in position:
                    anchor = position[k]
                elif k not in matched_base:  # removed (a moved one is listed where it is now)
                    after.setdefault(anchor, []).append(k)
            if after:
                merged = [(-1, r) for r in after.get(-1, ())]
                for i, kid in enumerate(kids):
                    merged.append(kid)
                    merged.extend((-1, r) for r in after.get(i, ()))
                kids = merged
        stack.extend((hk, bk, depth + 1, me) for hk, bk in reversed(kids))
    return out


# --- moved components (issue 5) ----------------------------------------------------------------


def _match_moved(base: _Side, head: _Side) -> dict[str, str]:
    """Match components present on one side only by structure: head path -> base path.

    A removed component (base pre-order, so parents first) is matched to an added one
      1. under the new place of its moved parent with the same name and module type (the rest of a
         renamed or wrapped subtree follows its root, even where a layer inside it changed), else
      2. with the same module type, parameter count and child names, else
      3. for containers, with the same module type and child names (their content may have changed);
    among several candidates the one with the same name, then the closest depth, then the closest
    relative position wins. Parameter shapes are not in the rows; the parameter count stands in.
    """
    added = [i for i, p in enumerate(head.path) if p not in base.index]
    removed = [i for i, p in enumerate(base.path) if p not in head.index]
    if not added or not removed:
        return {}

    def signature(side: _Side, i: int, strict: bool) -> tuple[Any, ...]:
        names = tuple(side.name[c] for c in side.children[i])
        return (side.module_type[i], side.param_count[i], names) if strict else (side.module_type[i], names)

    strict: dict[tuple[Any, ...], list[int]] = {}
    loose: dict[tuple[Any, ...], list[int]] = {}
    for a in added:
        strict.setdefault(signature(head, a, True), []).append(a)
        if head.children[a]:
            loose.setdefault(signature(head, a, False), []).append(a)
    added_set = set(added)
    head_of: dict[int, int] = {}  # base index -> head index, for matched removed components
    taken: set[int] = set()
    n_base, n_head = len(base.path), len(head.path)
    for r in removed:
        new_parent = head_of.get(base.parent[r])
        if new_parent is not None:
            candidate = head.index.get(_child_path(head.path[new_parent], base.name[r]), -1)
            if candidate in added_set and candidate not in taken and head.module_type[candidate] == base.module_type[r]:
                head_of[r] = candidate
                taken.add(candidate)
                continue
        pools = [strict.get(signature(base, r, True), [])]
        if base.children[r]:
            pools.append(loose.get(signature(base, r, False), []))
        for pool in pools:
            free = [a for a in pool if a not in taken]
            if free:
                best = min(
                    free,
                    key=lambda a: (
                        head.name[a] != base.name[r],
                        abs(head.depth[a] - base.depth[r]),
                        abs(a / n_head - r / n_base),
                    ),
                )
                head_of[r] = best
                taken.add(best)
                break
    return {head.path[h]: base.path[b] for b, h in head_of.items()}


def _child_path(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


# --- helpers -----------------------------------------------------------------------------------


def _meta_from_rows(rows: pl.DataFrame) -> dict[str, Any]:
    if rows.height == 0:
        return {}
    first = rows.row(0, named=True)
    return {k: first.get(k) for k in ("model", "version", "run_id")}


def _warnings(
    base_meta: dict[str, Any],
    head_meta: dict[str, Any],
    base_by_phase: dict[str, Any],
    head_by_phase: dict[str, Any],
) -> list[str]:
    """Things that make the comparison less than like for like, in words."""
    out = []
    if base_meta.get("model") != head_meta.get("model"):
        out.append(
            f"comparing different models ({base_meta.get('model')} and {head_meta.get('model')}): "
            "components are aligned by path only"
        )
    for phase in schema.PHASES:
        if (phase in base_by_phase) != (phase in head_by_phase):
            side = "base" if phase in base_by_phase else "head"
            out.append(f"the {phase} phase is only in the {side} run and is not compared")
    b_dev, h_dev = _device_name(base_meta), _device_name(head_meta)
    if b_dev and h_dev and b_dev != h_dev:
        out.append(f"the runs were measured on different devices ({b_dev} and {h_dev}): latency deltas mix both")
    if base_meta.get("dtype") and head_meta.get("dtype") and base_meta["dtype"] != head_meta["dtype"]:
        out.append(f"the runs use different dtypes ({base_meta['dtype']} and {head_meta['dtype']})")
    b_depth = (base_meta.get("config") or {}).get("depth")
    h_depth = (head_meta.get("config") or {}).get("depth")
    if b_depth != h_depth and (base_meta.get("config") is not None and head_meta.get("config") is not None):
        out.append(
            f"the runs were collected to different depths ({b_depth} and {h_depth}): components below "
            "the shallower limit show as added or removed"
        )
    return out


def _device_name(meta: dict[str, Any]) -> str | None:
    device = meta.get("device")
    return device.get("name") if isinstance(device, dict) else None


def _identity(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("model", "version", "run_id", "created_at")} | {
        "device": _device_name(meta),
        "dtype": meta.get("dtype"),
    }


def _check_metric(metric: str) -> None:
    if metric not in DIFF_METRICS:
        raise CbsiteError(f"unknown diff metric {metric!r}: use one of {', '.join(DIFF_METRICS)}")


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _sig3(value: float) -> str:
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def _pct_fits(fraction: float) -> bool:
    """True when `_pct` writes the fraction as a share a person can read: 0 % to 100 % once rounded."""
    return 0 <= round(fraction * 100) <= 100


def _signed_pct(change: float) -> str:
    pct = change * 100
    if pct == 0:
        return "±0%"
    if abs(pct) >= 1:
        text = f"{abs(pct):.0f}%"
    elif abs(pct) >= 0.001:
        text = f"{abs(pct):.2g}%"
    else:
        text = "<0.001%"  # a real but tiny change: never shown as ±0%
    return ("+" if pct > 0 else MINUS) + text


def _short_type(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]
