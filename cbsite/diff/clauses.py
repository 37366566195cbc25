"""A diff's summary as data: one `Clause` per fact (a total that moved or did not, where a change is, the
components' kinds, what lacks numbers, the step's throughput, a warning), in the order the summary says them.
cbsite/diff/summary.py turns them into words; the home page (generator/diffdata.py) groups them; nothing reads the
words back.

Which facts are said follows these rules:
* totals: parameter memory once (it is static), then FLOPs, peak memory and latency of every phase. With latency
  verdicts (phase -> the whole model's judgement, comparison.judgement) a latency total is a change only where
  its verdict is regressed or improved; without them it is "not judged (single round)", never judged by the
  within-run IQR rule.
* where: FLOPs, parameters and peak memory in the main phase (backward FLOPs grow where forward ones do); latency
  in every phase, since backward often moves for other reasons and by more. With two phases each names its phase.
  A share is given only where it means something: between 0 and 100 %, never for peak memory (a maximum, see
  NO_SHARE) and never where the own changes cancel out (`RunDiff.cancelled`); otherwise amounts. Components that
  tie for the largest part of a change are named as a tie, never one of them alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from cbsite import format as cfmt
from cbsite import throughput
from cbsite.diff.comparison import NOT_JUDGED
from cbsite.diff.record import (
    KINDS,
    NO_SHARE,
    ComponentDelta,
    Total,
    display_path,
    is_change,
)

if TYPE_CHECKING:
    from cbsite.diff.rundiff import RunDiff

TOTAL_STATUSES = ("changed", "noise", "unchanged", "unknown", "undecided")
WHERE_FORMS = ("cancelled", "tie", "own", "offset", "most", "largest")


@dataclass(frozen=True)
class Clause:
    """One fact of a diff's summary. `kind` says which fields it fills:

    * title: `model`, `version`, `base_model`, `base_version`; nothing: the same, when no phase was compared;
    * total: `metric`, `phase`, `status` (TOTAL_STATUSES), `base`, `head`, `amount` (the delta), `verdict`
      (latency's, when judged);
    * where: `metric`, `phase`, `named_phase` (say the phase), `growing`, `form` (WHERE_FORMS), `path` and
      `module_type` of the largest own change, `amount` (its own change, each one's for a tie), `share` (None:
      no share given), `total` (the whole model's delta), `paths` (a tie's), `up`/`down`/`complete` (cancelled:
      `amount` is then the net);
    * counts: `phase`, `counts` ((kind, n) of every kind present); flagged: `paths` (lacking numbers);
    * step: `steps` (throughput.Change per mode); warning: `text`.
    """

    kind: str
    metric: str | None = None
    phase: str | None = None
    status: str | None = None
    verdict: str | None = None
    base: float | None = None
    head: float | None = None
    amount: float | None = None
    form: str | None = None
    named_phase: bool = False
    growing: bool = False
    path: str | None = None
    module_type: str | None = None
    share: float | None = None
    total: float | None = None
    paths: tuple[str, ...] = ()
    up: float | None = None
    down: float | None = None
    complete: bool = True
    counts: tuple[tuple[str, int], ...] = ()
    steps: tuple[Any, ...] = ()
    text: str | None = None
    model: str | None = None
    version: str | None = None
    base_model: str | None = None
    base_version: str | None = None


def summary_clauses(rd: RunDiff, latency: dict[str, str] | None = None,
                    latency_counts: Callable[[ComponentDelta], bool] | None = None) -> list[Clause]:
    """The facts of `rd`'s summary in order (see the module docstring). `latency`: phase -> the whole model's latency
    verdict, when latency was judged; `latency_counts`: whether a component's latency change counts (its verdict)."""
    ident = {"model": rd.head_meta.get("model", "?"), "version": rd.head_meta.get("version", "?"),
             "base_model": rd.base_meta.get("model", "?"), "base_version": rd.base_meta.get("version", "?")}
    if not rd.totals:
        return [Clause("nothing", **ident)] + [Clause("warning", text=w) for w in rd.warnings]
    main = "forward" if "forward" in rd.totals else rd.phases[0]
    out = [Clause("title", **ident)]
    out += _totals(rd, main, latency)
    out += _wheres(rd, main, latency, latency_counts)
    counts = rd.counts(main)
    out.append(Clause("counts", phase=main, counts=tuple((k, counts[k]) for k in KINDS if counts[k])))
    model = ident["model"]
    flagged = sorted({c.path for c in rd.components if c.flagged}, key=lambda p: display_path(p, model))
    if flagged:
        out.append(Clause("flagged", paths=tuple(flagged)))
    if steps := throughput.changes(rd.base_meta, rd.head_meta):
        out.append(Clause("step", steps=tuple(steps.values())))
    out += [Clause("warning", text=w) for w in rd.warnings]
    return out


def _totals(rd: RunDiff, main: str, latency: dict[str, str] | None) -> list[Clause]:
    """One clause per total: parameter memory once, then FLOPs, peak memory and latency of every phase."""
    items = [("param_bytes", main)] + [(m, p) for p in rd.phases for m in ("flops", "peak_memory_bytes", "latency_ms")]
    out = []
    for metric, phase in items:
        t = rd.totals[phase][metric]
        verdict = None
        if metric == "latency_ms":  # one story: the verdict where latency was judged, "not judged" otherwise
            verdict = NOT_JUDGED if latency is None else latency.get(phase, "not judged")
        if verdict in ("regressed", "improved") and t.delta is not None:
            status = "changed"
        elif verdict == "unchanged":
            status = "unchanged"
        elif verdict is not None:
            status = "undecided"
        elif t.delta is None:
            status = "unknown"
        elif t.noise:
            status = "noise"
        elif is_change(metric, t.base, t.head, t.delta):
            status = "changed"
        else:
            status = "unchanged"
        out.append(Clause("total", metric=metric, phase=phase, status=status, verdict=verdict, base=t.base,
                          head=t.head, amount=t.delta))
    return out


def _wheres(rd: RunDiff, main: str, latency: dict[str, str] | None,
            latency_counts: Callable[[ComponentDelta], bool] | None) -> list[Clause]:
    """Where each total that changed changed: FLOPs, parameters and peak memory in the main phase, latency in each."""
    named = len(rd.phases) > 1
    checks = [(m, main) for m in ("flops", "param_bytes", "peak_memory_bytes")] + [("latency_ms", p) for p in rd.phases]
    out = []
    for metric, phase in checks:
        total = rd.totals[phase][metric]
        if total.delta in (None, 0) or not is_change(metric, total.base, total.head, total.delta):
            continue
        if metric == "latency_ms" and (latency or {}).get(phase) not in ("regressed", "improved"):
            continue  # an unjudged or undecided latency change is no finding to attribute
        counts = latency_counts if metric == "latency_ms" else None
        if (clause := _where(rd, metric, phase, total, named and metric != "param_bytes", counts)) is not None:
            out.append(clause)
    return out


def _where(rd: RunDiff, metric: str, phase: str, total: Total, named: bool,
           counts: Callable[[ComponentDelta], bool] | None) -> Clause | None:
    """Where a total's change is: the largest own change in its direction (a component that moved the other way
    is an offset, not where the growth is), a tie of several, or the parts up and down when they cancel out."""
    assert total.delta is not None  # `_wheres` passes only totals that changed
    growing = total.delta > 0
    where: dict[str, Any] = {"metric": metric, "phase": phase, "named_phase": named, "growing": growing,
                             "total": total.delta}
    if (cancel := rd.cancelled(metric, phase)) is not None:
        return Clause("where", form="cancelled", amount=cancel.net, up=cancel.up, down=cancel.down,
                      complete=cancel.complete, **where)
    # `top` returns only components with a known own change, so self_delta is a number here
    best = [c for c in rd.top(metric, phase, len(rd.components), counts)
            if (cast(float, c.self_delta[metric]) > 0) == growing]
    if not best:
        return None
    c, own = best[0], best[0].self_delta[metric]
    tied = [t for t in best if t.self_delta[metric] == own]
    share = None if metric in NO_SHARE else c.share[metric]
    if len(tied) > 1:
        form = "tie"
    elif share is None:
        form = "own"  # peaks are maxima: whose own peak moved most, with its amount and no percentage
    elif not cfmt.share_fits(share):
        form = "offset"  # more than the whole model's change: partly offset elsewhere
    else:
        form = "most" if share >= 0.5 else "largest"
    return Clause("where", form=form, path=c.path, module_type=c.module_type, amount=own, share=share,
                  paths=tuple(t.path for t in tied) if len(tied) > 1 else (), **where)
