"""Step throughput of runs: run.json's `step` record read, printed, compared and gated.

Core module (no torch, no jinja2). The collector (cbsite/collector/step.py) times the whole model's
training iteration (`train`) and inference forward (`eval`) and stores, per mode: `ms` (median of the
rounds' medians), `p25_ms`/`p75_ms`, `examples_per_s` (batch size / seconds per iteration) and the
raw `blocks` of every round. Here:

* `step_lines(meta)`: what `cbsite show` prints;
* `changes(base_meta, head_meta)`: the throughput change of each mode between two runs (the diff);
* `sentence(changes)`: the diff summary's sentence on them;
* gate rules ``throughput<-N%`` (both modes), ``train_throughput<-N%``, ``eval_throughput<-N%``: a
  rule is broken where examples/s **dropped** by more than N %. It is judged only with evidence: when
  both runs have step blocks from 2 or more rounds, Welch's test on the rounds' log medians of
  seconds per example (`cbsite.stats.unpaired`, floor = the drop as a time ratio, 1/(1-N%) - 1) must
  call the head *regressed*. Otherwise the rule is "not judged", as latency rules are.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from cbsite import format as cfmt
from cbsite import stats

MODES = ("train", "eval")
RULE_METRICS = {"throughput": MODES, "train_throughput": ("train",), "eval_throughput": ("eval",)}
RULE_RE = re.compile(r"^(?P<metric>[a-z_]+)<(?P<limit>[+-]?\d+(?:\.\d+)?)%$")
NOT_JUDGED = ("throughput needs step blocks from 2 or more rounds in both runs; collect both with "
              "`cbsite collect --rounds N` (N >= 2)")


def step_of(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    step = meta.get("step")
    return step if isinstance(step, dict) else None


def mode_of(meta: Mapping[str, Any], mode: str) -> dict[str, Any] | None:
    """The measured record of one mode, or None (no step, skipped or failed)."""
    step = step_of(meta)
    record = step.get(mode) if step else None
    return record if isinstance(record, dict) and record.get("status") == "measured" else None


def step_lines(meta: Mapping[str, Any]) -> list[str]:
    """Plain lines for the terminal: one per mode, after a line on how the step was measured."""
    step = step_of(meta)
    if step is None:
        return []
    opt = step.get("optimizer") or {}
    head = (f"step (whole model, batch {step.get('batch_size') or '?'}, optimizer {opt.get('name', '?')} lr {opt.get('lr', '?')}, "
            f"{step.get('rounds', 1)} round{'s' * (step.get('rounds', 1) != 1)}):")
    lines = [head]
    for mode in MODES:
        record = step.get(mode)
        if not isinstance(record, dict):
            continue
        label = "train step" if mode == "train" else "eval forward"
        if record.get("status") != "measured":
            lines.append(f"  {label}: {record.get('status', '?')} ({record.get('error') or 'no reason given'})")
            continue
        lines.append(f"  {label}: {cfmt.ms_g3(record.get('ms'))}/iter (p25 {cfmt.ms_g3(record.get('p25_ms'))}, p75 {cfmt.ms_g3(record.get('p75_ms'))}), "
                     f"{cfmt.examples_rate(record.get('examples_per_s'))}"
                     + (f", {record['contended_blocks']} contended blocks" if record.get("contended_blocks") else ""))
    return lines


def round_log_seconds_per_example(record: Mapping[str, Any], batch_size: int | None) -> list[float]:
    """Per round: log of the median seconds per example over its uncontended blocks (all, when < 3 are)."""
    rounds: dict[int, list[dict[str, Any]]] = {}
    for b in record.get("blocks") or []:
        rounds.setdefault(int(b.get("round", 0)), []).append(b)
    out = []
    for _, blocks in sorted(rounds.items()):
        clean = [b["seconds"] for b in blocks if not b.get("contended")]
        values = clean if len(clean) >= min(3, len(blocks)) else [b["seconds"] for b in blocks]
        m = statistics.median(values) / (batch_size or 1)
        if m > 0:
            out.append(math.log(m))
    return out


@dataclass(frozen=True)
class Change:
    """One mode's throughput, base vs head: examples/s, ms per iteration, change, and the rounds behind it."""

    mode: str
    base_eps: float | None
    head_eps: float | None
    base_ms: float | None
    head_ms: float | None
    change: float | None  # head / base examples/s - 1
    base_rounds: list[float]  # per-round log seconds per example
    head_rounds: list[float]

    @property
    def judgeable(self) -> bool:
        return len(self.base_rounds) >= 2 and len(self.head_rounds) >= 2

    def verdict(self, drop: float = stats.FLOOR) -> stats.Verdict | None:
        """Welch's test on rounds (time per example): `regressed` means the throughput dropped by > drop."""
        if not self.judgeable:
            return None
        return stats.unpaired(self.base_rounds, self.head_rounds, floor=1 / (1 - drop) - 1)

    def to_dict(self) -> dict[str, Any]:
        finite = cfmt.json_safe
        return {"mode": self.mode, "base_examples_per_s": finite(self.base_eps), "head_examples_per_s": finite(self.head_eps),
                "base_ms": finite(self.base_ms), "head_ms": finite(self.head_ms), "change": finite(self.change),
                "base_rounds": len(self.base_rounds), "head_rounds": len(self.head_rounds)}


def changes(base_meta: Mapping[str, Any], head_meta: Mapping[str, Any]) -> dict[str, Change]:
    """Each mode measured in both runs: its change. Empty when either run has no step record."""
    out: dict[str, Change] = {}
    base_step, head_step = step_of(base_meta), step_of(head_meta)
    if base_step is None or head_step is None:
        return out
    for mode in MODES:
        b, h = mode_of(base_meta, mode), mode_of(head_meta, mode)
        if b is None or h is None:
            continue
        be, he = b.get("examples_per_s"), h.get("examples_per_s")
        change = he / be - 1 if be and he else None
        out[mode] = Change(mode, be, he, b.get("ms"), h.get("ms"), change,
                           round_log_seconds_per_example(b, base_step.get("batch_size")),
                           round_log_seconds_per_example(h, head_step.get("batch_size")))
    return out


def diff_record(base_meta: Mapping[str, Any], head_meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The diff's JSON `throughput`: per mode, both sides and the change; None when a run has no step."""
    found = changes(base_meta, head_meta)
    if not found:
        return None
    return {mode: c.to_dict() for mode, c in found.items()}


def sentence(changes: list[Change]) -> str:
    """The diff summary's sentence on the modes' changes (`changes`), without its full stop:
    "Step throughput: train 6.5k → 6.1k examples/s (−6.2%), eval …"."""
    parts = []
    for c in changes:
        text = f"{c.mode} {cfmt.examples_rate(c.base_eps).replace(' examples/s', '')} → {cfmt.examples_rate(c.head_eps)}"
        if c.change is not None:
            text += f" ({cfmt.signed_pct2(c.change)}{'' if c.judgeable else ', not judged: single round'})"
        parts.append(text)
    return "Step throughput: " + ", ".join(parts)


def parse_rule(text: str) -> tuple[str, float] | str:
    """(metric, drop as a fraction) of ``METRIC<-N%``, or a problem in words."""
    match = RULE_RE.match(text.replace(" ", ""))
    if not match:
        return "not of the form METRIC<-N% (e.g. throughput<-5%)"
    metric = match["metric"]
    if metric not in RULE_METRICS:
        return f"unknown metric {metric!r} for a drop rule (use {', '.join(RULE_METRICS)})"
    limit = float(match["limit"]) / 100
    # -0% is a drop rule with no magnitude floor (any significant drop breaks it), as latency>+0% is for growth.
    if limit > 0 or not match["limit"].startswith("-"):
        return "the limit is a drop (-N%); a rise would fail every unchanged model"
    if limit <= -1:
        return "a drop is less than 100%"
    return metric, -limit


@dataclass(frozen=True)
class Judgement:
    """What one throughput rule found in one mode: broken, held, unknown or not judged."""

    mode: str
    outcome: str  # "broken" | "held" | "unknown" | "not judged"
    change: Change | None
    verdict: stats.Verdict | None
    reason: str = ""


def judge(metric: str, drop: float, base_meta: Mapping[str, Any], head_meta: Mapping[str, Any]) -> list[Judgement]:
    """Judge a drop rule in each of its modes (see the module docstring)."""
    found = changes(base_meta, head_meta)
    out = []
    for mode in RULE_METRICS[metric]:
        c = found.get(mode)
        if c is None:
            side = "base" if mode_of(base_meta, mode) is None else "head"
            out.append(Judgement(mode, "unknown", None, None, f"no measured {mode} step in the {side} run"))
            continue
        v = c.verdict(drop)
        if v is None:
            out.append(Judgement(mode, "not judged", c, None, NOT_JUDGED))
        elif v.verdict == "regressed":
            out.append(Judgement(mode, "broken", c, v, v.reason))
        elif v.verdict in ("inconclusive", "not judged"):
            out.append(Judgement(mode, "unknown", c, v, v.reason))
        else:
            out.append(Judgement(mode, "held", c, v, v.reason))
    return out
