"""The regression gate: its rules, their judgement on a diff (`check`) and the latency verdict rule that the
summary, the PR comment and the diff page share (`latency_changed`). Data only: cbsite/review.py words it.

Core module: no torch, no jinja2. `cbsite diff` (the CLI) is a thin caller of what is here.

Gate rules
----------
A rule is ``[GLOB:]METRIC>+N%``: ``flops>+5%`` (the whole model's total), ``over_arch.*:latency>+20%``
(every component whose head path matches the glob, `*` crossing dots). METRIC is one of RULE_METRICS
(``peak_memory`` and ``latency`` stand for the ``peak_memory_bytes`` and ``latency_ms`` columns, whose
names work too). A rule is broken where a per-forward value grew by more than N % of its base value:
* a value that grew from 0, or a component that is new in the head run, grew by more than any N %;
* a latency change within the combined IQR of the two runs (cbsite/diff/alignment.py's noise rule) never breaks a rule;
* a value that is missing (failed or skipped component) cannot be judged: it is listed as unknown and
  does not break the rule, so the report says what the gate could not see;
* every compared phase is checked (or the one `--phase` names); parameter bytes are static and are
  checked once, in the first phase;
* a glob that matches no component of either run is an error (CbsiteError, exit 2), never a silent pass.
A drop rule ``throughput<-5%`` (or ``train_throughput``, ``eval_throughput``) is broken where the whole
model's step examples/s fell by more than N %, judged on both runs' rounds (cbsite/throughput.py).
Rules come from ``--fail-on`` or, when none is given, from ``fail_on`` in the ``gate`` table of the
configuration file (``[tool.cbsite.gate]`` in pyproject.toml or ``[gate]`` in cbsite.toml, found from
the working directory upwards as the plugin settings are). Every bad rule is reported at once.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbsite import throughput
from cbsite.config import find_config
from cbsite.diff import traffic
from cbsite.diff.comparison import NOT_JUDGED_HINT, LatencyEvidence, judgement
from cbsite.diff.record import REL_TOL, ComponentDelta
from cbsite.diff.rundiff import RunDiff
from cbsite.errors import CbsiteError

# Rule metric name -> diff metric (column) name.
RULE_METRICS = {
    "flops": "flops",
    "param_bytes": "param_bytes",
    "peak_memory": "peak_memory_bytes",
    "peak_memory_bytes": "peak_memory_bytes",
    "latency": "latency_ms",
    "latency_ms": "latency_ms",
    "bytes_moved": "bytes_moved",
    # Sharded runs: bytes the collectives send + receive (or either alone) per forward, cbsite/diff/traffic.py.
    "comm_bytes": "comm_bytes",
    "comm_bytes_sent": "comm_bytes_sent",
    "comm_bytes_received": "comm_bytes_received",
}
_RULE_RE = re.compile(
    r"^(?:(?P<glob>[^:\s][^:]*):)?(?P<metric>[a-z_]+)>(?P<limit>[+-]?\d+(?:\.\d+)?)%$"
)
GATE_KEYS = ("fail_on",)


# --- rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One gate rule: `metric` (a diff column) may grow by at most `limit` (a fraction) per component."""

    text: str
    metric: str
    limit: float  # 0.05 for "+5%"
    glob: str | None = None  # None: the whole model's total


def parse_rules(texts: Iterable[str], source: str = "--fail-on") -> list[Rule]:
    """Parse gate rules; every malformed one is reported in one CbsiteError naming `source`."""
    rules, problems = [], []
    for text in texts:
        rule, problem = _parse_rule(text)
        if problem:
            problems.append(f"{text!r}: {problem}")
        else:
            assert rule is not None  # `_parse_rule` gives either a rule or a problem
            rules.append(rule)
    if problems:
        raise CbsiteError(
            f"bad gate rule{'s' * (len(problems) > 1)} in {source}: " + "; ".join(problems)
            + ". A rule is [GLOB:]METRIC>+N%, e.g. flops>+5% or 'over_arch.*:latency>+20%'; metrics: "
            + ", ".join(RULE_METRICS) + "; or a throughput drop METRIC<-N%, e.g. throughput<-5%; metrics: "
            + ", ".join(throughput.RULE_METRICS)
        )
    return rules


def _parse_rule(text: Any) -> tuple[Rule | None, str | None]:
    if not isinstance(text, str):
        return None, "a rule is a string"
    if "<" in text:  # a drop rule: throughput<-5% (cbsite/throughput.py)
        parsed = throughput.parse_rule(text)
        if isinstance(parsed, str):
            return None, parsed
        return Rule(text=text.strip(), metric=parsed[0], limit=parsed[1]), None
    match = _RULE_RE.match(text.replace(" ", ""))
    if not match:
        return None, "not of the form [GLOB:]METRIC>+N%"
    metric = match["metric"]
    if metric not in RULE_METRICS:
        return None, f"unknown metric {metric!r}"
    limit = float(match["limit"]) / 100
    if limit < 0:
        return None, "the limit is a growth (+N%); a negative one would fail every unchanged model"
    return Rule(text=text.strip(), metric=RULE_METRICS[metric], limit=limit, glob=match["glob"]), None


def config_rules(start: Path) -> tuple[list[Rule], Path] | None:
    """The gate rules of the configuration file nearest to `start`, or None when it has none.

    Found as the plugin settings are (cbsite/collector/plugins/registry.py: the nearest cbsite.toml, else
    pyproject.toml with a [tool.cbsite] table); re-implemented here because that package imports torch.
    """
    found = find_config(start)
    if found is None:
        return None
    path, table = found
    gate = table.get("gate")
    if gate is None:
        return None
    where = f"{path} [{'tool.cbsite.' if path.name == 'pyproject.toml' else ''}gate]"
    if not isinstance(gate, dict):
        raise CbsiteError(f"{where} must be a table with fail_on = [\"flops>+5%\", ...]")
    problems = [f"unknown key {k!r} (valid: {', '.join(GATE_KEYS)})" for k in gate if k not in GATE_KEYS]
    texts = gate.get("fail_on", [])
    if not isinstance(texts, list):
        problems.append("fail_on must be a list of rules, e.g. fail_on = [\"flops>+5%\"]")
        texts = []
    try:
        rules = parse_rules(texts, where)
    except CbsiteError as exc:
        problems.append(str(exc))
        rules = []
    if problems:
        raise CbsiteError(f"{where}: " + "; ".join(problems))
    return rules, path


# --- the gate ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Breach:
    """One place where a rule is broken: the total (path None) or a component, in one phase."""

    rule: Rule
    phase: str
    path: str | None
    base_path: str | None
    base: float | None
    head: float | None
    change: float | None  # head / base - 1; None when it grew from nothing (new)
    verdict: dict[str, Any] | None = None  # latency: the statistical verdict behind the breach (stats.Verdict)


@dataclass
class GateResult:
    rules: list[Rule]
    breaches: list[Breach] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # "rule: where" for values the gate could not judge
    not_judged: list[str] = field(default_factory=list)  # latency rules without evidence (no rounds, no comparison)
    verdicts: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)  # (rule, phase, path, verdict)

    @property
    def passed(self) -> bool:
        return not self.breaches

    def broken_rules(self) -> list[Rule]:
        seen = {b.rule.text for b in self.breaches}
        return [r for r in self.rules if r.text in seen]


def check(rd: RunDiff, rules: Sequence[Rule], phases: Sequence[str] | None = None,
          latency: LatencyEvidence | None = None) -> GateResult:
    """Apply `rules` to a diff in `phases` (default: every compared phase); see the module docstring.

    Latency rules are judged on `latency` evidence only (a comparison's paired units, or both runs'
    rounds): without it they are "not judged", never passed or failed on noise.
    """
    phases = list(phases) if phases else rd.phases
    _refuse_unmatched(rd, rules, phases)
    result = GateResult(rules=list(rules))
    for rule in rules:
        if rule.metric == "latency_ms":
            _judge_latency(result, rd, rule, phases, latency)
            continue
        if rule.metric in throughput.RULE_METRICS:
            _judge_throughput(result, rd, rule)
            continue
        if rule.metric in traffic.METRICS:
            _judge_traffic(result, rd, rule, phases)
            continue
        # Parameter bytes do not depend on the phase: judge them once.
        for phase in phases[:1] if rule.metric == "param_bytes" else phases:
            if rule.glob is None:
                t = rd.totals[phase][rule.metric]
                _judge(result, rule, phase, None, None, t.base, t.head, t.noise, exists=(True, True))
            else:
                for c in rd.for_phase(phase):
                    if fnmatch.fnmatchcase(c.path, rule.glob) and c.kind != "removed":
                        _judge(result, rule, phase, c.path, c.base_path, c.base[rule.metric], c.head[rule.metric],
                               c.noise[rule.metric], exists=(c.kind != "added", True))
    return result


def _refuse_unmatched(rd: RunDiff, rules: Sequence[Rule], phases: Sequence[str]) -> None:
    """A rule whose glob matches no component of either run is a typo that would turn the gate off: refuse it."""
    paths = sorted({p for ph in phases for c in rd.for_phase(ph) for p in (c.path, c.base_path) if p is not None})
    problems = []
    for rule in rules:
        if rule.glob is None or any(fnmatch.fnmatchcase(p, rule.glob) for p in paths):
            continue
        near = difflib.get_close_matches(rule.glob.replace("*", "").strip("."), paths, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""
        problems.append(f"{rule.text!r}: {rule.glob!r} matches no component{hint}")
    if problems:
        raise CbsiteError(
            f"gate rule{'s' * (len(problems) > 1)} that match nothing: " + "; ".join(problems)
            + ". A glob matches whole component paths (`*` crosses dots), e.g. 'over_arch.*'; "
            "`cbsite show RUN` lists the paths"
        )


def _judge_latency(result: GateResult, rd: RunDiff, rule: Rule, phases: Sequence[str],
                   latency: LatencyEvidence | None) -> None:
    """A latency rule breaks where a component is *regressed* by more than the rule's limit.

    The limit is the verdict's magnitude floor: significant at the level alpha (one-sided t-test over the
    units) and an estimated change of at least the limit. A rule with a glob judges its components as a
    family (Holm). A new component that takes time breaks the rule, as for every metric.
    """
    if latency is None:
        result.not_judged.append(f"{rule.text}: not judged: {NOT_JUDGED_HINT}")
        return
    for phase in phases:
        comps = [c for c in rd.for_phase(phase) if c.kind != "removed"
                 and (fnmatch.fnmatchcase(c.path, rule.glob) if rule.glob is not None else c.path == "")]
        keys = [(c.path, phase) for c in comps if c.kind != "added"]
        if rule.glob is not None and len(keys) > 1:
            verdicts = latency.family(keys, alpha=latency.alpha, floor=rule.limit)
        else:
            verdicts = {k: v for k in keys if (v := latency.verdict(*k, alpha=latency.alpha, floor=rule.limit)) is not None}
        for c in comps:
            where = f"{phase} {'total' if rule.glob is None else repr(c.path)}"
            if c.kind == "added":
                if c.head["latency_ms"]:
                    result.breaches.append(Breach(rule, phase, c.path, None, None, c.head["latency_ms"], None))
                continue
            v = verdicts.get((c.path, phase))
            if v is None:
                result.unknown.append(f"{rule.text}: {where} (not timed on both sides)")
            elif v.verdict == "regressed":
                assert v.ratio is not None  # a judged verdict always has its ratio
                result.breaches.append(Breach(rule, phase, None if rule.glob is None else c.path, c.base_path,
                                              c.base["latency_ms"], c.head["latency_ms"], v.ratio - 1, v.to_dict()))
            elif v.verdict in ("inconclusive", "not judged"):
                result.unknown.append(f"{rule.text}: {where} {v.reason}")
            if v is not None:
                result.verdicts.append((rule.text, phase, c.path, v.to_dict()))


def _judge_throughput(result: GateResult, rd: RunDiff, rule: Rule) -> None:
    """A drop rule: broken where the step's examples/s fell by more than the limit, judged on both runs'
    rounds (cbsite/throughput.py); without rounds on both sides it is "not judged"."""
    for j in throughput.judge(rule.metric, rule.limit, rd.base_meta, rd.head_meta):
        if j.outcome == "broken" and j.change is not None:
            result.breaches.append(Breach(rule, j.mode, None, None, j.change.base_eps, j.change.head_eps,
                                          j.change.change, j.verdict.to_dict() if j.verdict else None))
        elif j.outcome == "not judged":
            result.not_judged.append(f"{rule.text}: not judged ({j.mode}): {j.reason}")
        elif j.outcome == "unknown":
            result.unknown.append(f"{rule.text}: {j.mode} step ({j.reason})")
        if j.verdict is not None:
            result.verdicts.append((rule.text, j.mode, "", j.verdict.to_dict()))


def _judge_traffic(result: GateResult, rd: RunDiff, rule: Rule, phases: Sequence[str]) -> None:
    """A communication bytes rule (sharded runs): judged on `rd.traffic` as any other count, by component path
    (a glob) or on the whole model (the root); a component that communicates on neither side is not judged."""
    by_key = {(t.phase, t.path): t for t in rd.traffic}
    if not by_key:
        result.unknown.append(f"{rule.text}: no collective traffic in either run (only sharded runs have it)")
        return
    for phase in phases:
        for c in rd.for_phase(phase):
            if c.kind == "removed" or not (fnmatch.fnmatchcase(c.path, rule.glob) if rule.glob is not None else c.path == ""):
                continue
            # A moved component (matched by structure) compares its base path's traffic with its head path's.
            head, base = by_key.get((phase, c.path)), by_key.get((phase, c.base_path or c.path))
            if head is None and base is None:
                continue
            path = None if rule.glob is None else c.path
            _judge(result, rule, phase, path, c.base_path if path else None, base.base[rule.metric] if base else None,
                   head.head[rule.metric] if head else None, False, exists=(c.kind != "added", True))


def _judge(result: GateResult, rule: Rule, phase: str, path: str | None, base_path: str | None,
           base: float | None, head: float | None, noise: bool, exists: tuple[bool, bool]) -> None:
    where = f"{phase} {'total' if path is None else repr(path)}"
    if not exists[0]:  # a new component grew from nothing
        if head:
            result.breaches.append(Breach(rule, phase, path, base_path, None, head, None))
        elif head is None:
            result.unknown.append(f"{rule.text}: {where} (no value)")
        return
    if base is None or head is None:
        result.unknown.append(f"{rule.text}: {where} (no value in the {'base' if base is None else 'head'} run)")
        return
    if noise or head <= base:
        return
    change = head / base - 1 if base else None
    if change is None or change > rule.limit * (1 + REL_TOL):  # a limit hit exactly is not over it
        result.breaches.append(Breach(rule, phase, path, base_path, base, head, change))



CHANGE_VERDICTS = ("regressed", "improved")


def latency_changed(c: ComponentDelta, verdicts: Mapping[tuple[str, str], Any] | None) -> bool:
    """Does a component's latency count as a change? The one rule of the diff page, the summary and this
    comment: present on one side only, or a verdict of regressed or improved where latency was judged
    (`verdicts`: (path, phase) -> stats.Verdict); unjudged, a difference beyond the within-run noise."""
    if c.kind in ("added", "removed"):
        return bool(c.delta["latency_ms"])
    if verdicts is None:
        return bool(c.delta["latency_ms"]) and not c.noise["latency_ms"]
    v = verdicts.get((c.path, c.phase))
    return v is not None and v.verdict in CHANGE_VERDICTS


def latency_counts(evidence: LatencyEvidence | None) -> Callable[[ComponentDelta], bool] | None:
    """`latency_changed` bound to the evidence's verdicts, for RunDiff.summary and top (None: not judged)."""
    if evidence is None:
        return None
    verdicts = evidence.verdicts()
    return lambda c: latency_changed(c, verdicts)


def root_verdicts(evidence: LatencyEvidence | None, rd: RunDiff) -> dict[str, str] | None:
    """phase -> the whole model's latency judgement (comparison.judgement: the verdict, or "below the N % floor"),
    so the summary sentence agrees with the verdicts; None where latency was not judged."""
    if evidence is None:
        return None
    verdicts = evidence.verdicts()
    return {ph: judgement(verdicts[("", ph)], evidence.floor) for ph in rd.phases if ("", ph) in verdicts}

