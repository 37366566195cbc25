"""Align two runs component by component, classify each change and attribute it to submodules.

One implementation serves the site's diff pages and the CLI's `cbsite diff`, PR summary and gate.
Pure data: polars rows in, dataclasses out (`RunDiff`, its summary as `clauses`); words live in
cbsite/diff/summary.py, numbers as text in cbsite/format.py. The machinery is cbsite/diff/sides.py (one run's
phase as columns) and cbsite/diff/alignment.py (two phases aligned, every number computed).

The rules
---------
* **Alignment.** Components are aligned by `path` within each phase. Only phases present in both runs
  are compared; a phase present in one run only is named in `RunDiff.warnings`. With
  `match_moved=True`, components present on one side only are also matched by structure
  (see cbsite/diff/alignment.py `match_moved`) and reported as `moved`; components whose paths match are never moved.
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
* **Shares in words** (`summary`, from the structured `clauses`: cbsite/diff/clauses.py, cbsite/diff/summary.py). A
  share is written only where it means something: never for peak memory (NO_SHARE), never where the own
  changes cancel out (`RunDiff.cancelled`: up and down together above CANCEL x |net|; the diff page uses the
  same rule), and only between 0 % and 100 %; otherwise the amounts.
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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from cbsite import schema
from cbsite.archive import Run
from cbsite.diff import alignment, traffic
from cbsite.diff.clauses import Clause, summary_clauses
from cbsite.diff.record import (
    CANCEL,
    DIFF_METRICS,
    KINDS,
    NO_SHARE,
    Cancelled,
    ComponentDelta,
    Total,
    check_metric,
)
from cbsite.diff.sides import sides
from cbsite.diff.summary import paragraph
from cbsite.errors import CbsiteError
from cbsite.format import json_safe


@dataclass
class RunDiff:
    """The comparison of two runs: totals per phase and every aligned component."""

    base_meta: dict[str, Any]
    head_meta: dict[str, Any]
    totals: dict[str, dict[str, Total]]  # phase -> metric -> Total
    components: list[ComponentDelta]  # phase by phase, each in pre-order of head (removed where they were)
    warnings: list[str] = field(default_factory=list)
    # Sharded runs: collective bytes per communicating component (cbsite/diff/traffic.py TrafficDelta); [] otherwise.
    traffic: list[Any] = field(default_factory=list)
    # Answers of for_phase, top and cancelled, which the site and the summary ask for a dozen times each over the
    # same components; kept while `components` is the same list of the same length (a diff's components are not
    # changed once made).
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
        `counts`: where latency was judged, whether a component's change counts (gate.latency_changed: its
        verdict), instead of the within-run noise rule. Ties go to the deeper component, then to pre-order.
        """
        check_metric(metric)

        def ranked() -> list[ComponentDelta]:
            # Sorted on (size, depth, pre-order place) tuples made once, not by a key function called a thousand
            # times a ranking; the place is unique, so the components themselves are never compared.
            rows = [
                (-abs(cast(float, c.self_delta[metric])), -c.depth, i, c)
                for i, c in enumerate(self.for_phase(phase))
                if c.self_delta[metric] not in (None, 0) and (counts(c) if counts is not None else not c.noise[metric])
            ]
            rows.sort()
            return [row[3] for row in rows]

        if counts is not None:
            return ranked()[:n]
        return self._remembered(("top", metric, phase), ranked)[:n]

    def cancelled(self, metric: str, phase: str = "forward") -> Cancelled | None:
        """The own changes of `metric` in `phase` when they cancel out (up and down together more than CANCEL
        times the net change, or a net of zero with parts that moved), else None. Shares of such a net mean
        nothing ("2000000%"), so none are given for it. Peak memory (NO_SHARE) never cancels: it has no shares."""
        check_metric(metric)
        if metric in NO_SHARE or phase not in self.totals:
            return None
        return self._remembered(("cancelled", metric, phase), lambda: self._cancelled(metric, phase))

    def _cancelled(self, metric: str, phase: str) -> Cancelled | None:
        net = self.totals[phase][metric].delta
        comps = self.for_phase(phase)
        parts = [v for c in comps if (v := c.self_delta[metric]) is not None]
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


    def clauses(self, latency: dict[str, str] | None = None,
                latency_counts: Callable[[ComponentDelta], bool] | None = None) -> list[Clause]:
        """The summary as data, one `Clause` per fact in the order the summary says them (cbsite/diff/clauses.py).

        `latency` (phase -> the whole model's latency verdict, `cbsite.stats`), when latency was judged: a
        total is then a change only where its verdict is regressed or improved, unchanged where it is
        unchanged, and named by its judgement otherwise; without it latency is "not judged (single round)".
        `latency_counts` does the same for components (gate.latency_changed): where a latency change is,
        is then said of components whose verdict is a change, as the diff page draws them.
        """
        return summary_clauses(self, latency, latency_counts)

    def summary(self, latency: dict[str, str] | None = None,
                latency_counts: Callable[[ComponentDelta], bool] | None = None) -> str:
        """One plain-text paragraph in words: totals with ratios, where the change is, counts, warnings
        (`clauses` in words, cbsite/diff/summary.py)."""
        return paragraph(self.clauses(latency, latency_counts))

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
                        "base": json_safe(t.base),
                        "head": json_safe(t.head),
                        "delta": json_safe(t.delta),
                        "ratio": json_safe(t.ratio),
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
                        key: {m: json_safe(getattr(c, key)[m]) for m in DIFF_METRICS}
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
    base_meta = base_meta if base_meta is not None else alignment.meta_from_rows(base_rows)
    head_meta = head_meta if head_meta is not None else alignment.meta_from_rows(head_rows)
    base_sides = sides(base_rows, "base", base_meta)
    head_sides = sides(head_rows, "head", head_meta)
    phases = [p for p in schema.PHASES if p in base_sides and p in head_sides]
    warnings = alignment.warnings(base_meta, head_meta, base_sides, head_sides)
    if not phases:
        raise CbsiteError(
            f"the runs have no phase in common (base: {', '.join(base_sides) or 'none'}; "
            f"head: {', '.join(head_sides) or 'none'}); collect both with the same phases"
        )
    # Moves are matched once, on the forward structure when there is one, and applied to every phase,
    # so a component is moved in both phases or in neither.
    moved: dict[str, str] = {}
    if match_moved:
        moved = alignment.match_moved(base_sides[phases[0]], head_sides[phases[0]])

    totals: dict[str, dict[str, Total]] = {}
    components: list[ComponentDelta] = []
    for phase in phases:
        phase_totals, phase_components = alignment.diff_phase(phase, base_sides[phase], head_sides[phase], moved)
        totals[phase] = phase_totals
        components.extend(phase_components)
    return RunDiff(base_meta=base_meta, head_meta=head_meta, totals=totals, components=components, warnings=warnings,
                   traffic=[t for t in traffic.diff_traffic(base_rows, head_rows) if t.phase in phases])



def _identity(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("model", "version", "run_id", "created_at")} | {
        "device": alignment.device_name(meta),
        "dtype": meta.get("dtype"),
    }
