"""Reviewing a model change: the regression gate's rules and the PR summary, on top of `cbsite.diff`.

Core module: no torch, no jinja2. `cbsite diff` (cli.py) is a thin caller of what is here.

Gate rules
----------
A rule is ``[GLOB:]METRIC>+N%``: ``flops>+5%`` (the whole model's total), ``over_arch.*:latency>+20%``
(every component whose head path matches the glob, `*` crossing dots). METRIC is one of RULE_METRICS
(``peak_memory`` and ``latency`` stand for the ``peak_memory_bytes`` and ``latency_ms`` columns, whose
names work too). A rule is broken where a per-forward value grew by more than N % of its base value:
* a value that grew from 0, or a component that is new in the head run, grew by more than any N %;
* a latency change within the combined IQR of the two runs (`diff.py`'s noise rule) never breaks a rule;
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
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from cbsite import diff as cdiff
from cbsite import throughput, traffic
from cbsite.archive import RunRef, list_runs
from cbsite.comparison import NOT_JUDGED_HINT, LatencyEvidence
from cbsite.diff import ComponentDelta, RunDiff
from cbsite.config import find_config
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
    # Sharded runs: bytes the collectives send + receive (or either alone) per forward, cbsite/traffic.py.
    "comm_bytes": "comm_bytes",
    "comm_bytes_sent": "comm_bytes_sent",
    "comm_bytes_received": "comm_bytes_received",
}
_RULE_RE = re.compile(
    r"^(?:(?P<glob>[^:\s][^:]*):)?(?P<metric>[a-z_]+)>(?P<limit>[+-]?\d+(?:\.\d+)?)%$"
)
GATE_KEYS = ("fail_on",)
TOP_N = 5  # contributors per metric in the Markdown summary
MAX_TABLE_ROWS = 300  # rows of the collapsible full table; a PR comment holds at most 65,536 characters


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
    if change is None or change > rule.limit * (1 + cdiff.REL_TOL):  # a limit hit exactly is not over it
        result.breaches.append(Breach(rule, phase, path, base_path, base, head, change))


# --- the diff page on the site --------------------------------------------------------------------


def diff_page_url(site_url: str, base: RunRef, head: RunRef, runs: Path) -> str:
    """The address of the diff page of these two runs on a site built from the archive `runs`.

    The generator's scheme (cbsite/generator/pages.py `diff_url`, catalog.py): the newest runs of two
    consecutive versions of a model have `diffs/<model>/<base version>/<head version>/`; any other pair
    is `diffs/runs/<base run id>/<head run id>/`, a page that exists only when the site was built with
    `--diff BASE..HEAD`. Re-implemented here because the generator imports jinja2.
    """
    root = site_url if site_url.endswith("/") else site_url + "/"
    if base.model == head.model and _consecutive(runs, base, head):
        return f"{root}diffs/{head.model}/{base.version}/{head.version}/"
    return f"{root}diffs/runs/{base.run_id}/{head.run_id}/"


def _consecutive(runs: Path, base: RunRef, head: RunRef) -> bool:
    refs = sorted((r for r in list_runs(runs) if r.model == head.model), key=lambda r: r.run_id)
    versions: list[str] = []  # ordered by their first run, as the catalog orders them
    newest: dict[str, str] = {}
    for r in refs:
        if r.version not in newest:
            versions.append(r.version)
        newest[r.version] = r.run_id
    pairs = zip(versions, versions[1:])
    return any(newest[a] == base.run_id and newest[b] == head.run_id for a, b in pairs)


# --- reports -------------------------------------------------------------------------------------

REPORT_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms")


def main_phase(rd: RunDiff, phase: str | None) -> str:
    """The phase the contributors and tables show: the one asked for, else forward, else the first."""
    if phase is not None:
        rd.for_phase(phase)  # raises a CbsiteError naming the compared phases
        return phase
    return "forward" if "forward" in rd.totals else rd.phases[0]


LISTED_VERDICTS = ("regressed", "improved", "inconclusive")
MAX_LATENCY_ROWS = 40


def latency_rows(evidence: LatencyEvidence | None, rd: RunDiff, phases: Sequence[str]) -> list[tuple[str, str, Any]]:
    """(phase, path, Verdict) of the components a report lists: regressed, improved, inconclusive,
    the largest changes first; unchanged components are counted, not listed."""
    if evidence is None:
        return []
    order = {(c.path, c.phase): i for i, c in enumerate(rd.components)}
    verdicts = evidence.verdicts()
    rows = [(ph, path, v) for (path, ph), v in verdicts.items() if ph in phases and v.verdict in LISTED_VERDICTS]
    rank = {v: i for i, v in enumerate(LISTED_VERDICTS)}
    rows.sort(key=lambda r: (rank[r[2].verdict], -abs(math.log(r[2].ratio)) if r[2].ratio else 0,
                             order.get((r[1], r[0]), 0)))
    return rows


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
    """phase -> the whole model's latency verdict, so the summary sentence agrees with the verdicts."""
    if evidence is None:
        return None
    verdicts = evidence.verdicts()
    return {ph: verdicts[("", ph)].verdict for ph in rd.phases if ("", ph) in verdicts}


def latency_summary(evidence: LatencyEvidence | None, phases: Sequence[str]) -> str:
    """One line: how latency was judged, how many components got each verdict, the noise and the
    smallest change the session could detect."""
    if evidence is None:
        return f"Latency not judged: {NOT_JUDGED_HINT}."
    verdicts = {k: v for k, v in evidence.verdicts().items() if k[1] in phases}
    names = ("regressed", "improved", "unchanged", "inconclusive", "not judged")
    counts = {name: sum(v.verdict == name for v in verdicts.values()) for name in names}
    spreads = sorted(v.spread for v in verdicts.values() if v.spread is not None)
    detect = sorted(v.detectable for v in verdicts.values() if v.detectable is not None)
    parts = [f"{n} {name}" for name, n in counts.items() if n]
    units = "processes" if evidence.paired else "rounds per run"
    n = max((v.n for v in verdicts.values()), default=0)
    text = f"Latency judged on {evidence.describe()}, {n} {units}: " + ", ".join(parts or ["nothing timed on both sides"])
    if spreads:
        text += f"; noise (spread of units) median {_pct(spreads[len(spreads) // 2])}"
    if detect:
        text += f", smallest detectable change median {_pct(detect[len(detect) // 2])}"
    return text + "."


def _verdict_cells(v: Any) -> tuple[str, str]:
    ratio = "n/a" if v.ratio is None else f"{v.ratio:.3f}×"
    interval = "" if v.ci_low is None or v.ci_high is None else f"{v.ci_low:.3f}–{v.ci_high:.3f}×"
    return ratio, interval


def markdown(rd: RunDiff, gate: GateResult | None = None, *, phase: str | None = None,
             site_url: str | None = None, top: int = TOP_N, latency: LatencyEvidence | None = None) -> str:
    """GitHub-flavoured Markdown for a PR comment (see docs-notes/review.md for an example)."""
    model = rd.head_meta.get("model", "?")
    main = main_phase(rd, phase)
    phases = [phase] if phase else rd.phases
    out = [f"## cbsite: {_title(rd)}", ""]
    if gate is not None and gate.rules:
        out += [_gate_line(gate), ""]
    counts = latency_counts(latency)
    out += [rd.summary(latency=root_verdicts(latency, rd), latency_counts=counts), ""]
    out += _latency_section(rd, latency, phases, model)

    out += ["| metric | phase | base | head | change | ratio |", "|---|---|--:|--:|--:|--:|"]
    for metric in REPORT_METRICS:
        for ph in phases[:1] if metric == "param_bytes" else phases:
            t = rd.totals[ph][metric]
            change = "within noise" if t.noise else cdiff.format_ratio(t)
            incomplete = "" if t.complete else " (incomplete)"
            out.append(f"| {cdiff.LABELS[metric]}{incomplete} | {ph if metric != 'param_bytes' else 'static'} | "
                       f"{_amount(metric, t.base)} | {_amount(metric, t.head)} | {cdiff.format_delta(metric, t.delta)} | "
                       f"{change} |")
    out.append("")

    sections = []
    for metric in REPORT_METRICS:
        t = rd.totals[main][metric]
        rows = rd.top(metric, main, top, counts if metric == "latency_ms" else None)
        if not rows or not t.delta or t.noise:
            continue
        lines = [f"**{_cap(cdiff.LABELS[metric])}** {cdiff.format_delta(metric, t.delta)} ({cdiff.format_ratio(t)})",
                 "", "| component | type | kind | own change | share |", "|---|---|---|--:|--:|"]
        for c in rows:
            share = c.share[metric]
            lines.append(f"| {_path_cell(c, model)} | {_short(c.module_type)} | {c.kind} | "
                         f"{cdiff.format_delta(metric, c.self_delta[metric])} | {'' if share is None else _pct(share)} |")
        sections.append("\n".join(lines))
    if sections:
        out += [f"### Where the change is ({main})", "", "\n\n".join(sections), ""]

    comps = rd.for_phase(main)
    moved = [c for c in comps if c.kind == "moved"]
    added = [c for c in comps if c.kind == "added"]
    removed = [c for c in comps if c.kind == "removed"]
    if moved or added or removed:
        out += ["### Modules", ""]
        for label, items in (("Added", added), ("Removed", removed)):
            if items:
                out.append(f"- **{label}** ({len(items)}): " + _listing(items, model))
        if moved:
            out.append(f"- **Moved** ({len(moved)}), matched by structure:")
            for c in moved[:50]:
                changes = [f"{cdiff.LABELS[m]} {cdiff.format_delta(m, c.delta[m])}" for m in REPORT_METRICS
                           if c.delta[m] and not c.noise[m]]
                out.append(f"  - {_code(c.base_path or '', table=False)} → {_code(c.path, table=False)} ({_short(c.module_type)})"
                           + (": " + ", ".join(changes) if changes else ""))
            if len(moved) > 50:
                out.append(f"  - and {len(moved) - 50} more")
        out.append("")

    out += _traffic_section(rd, main, model)
    if gate is not None and gate.rules:
        out += _gate_section(gate, model)

    changed = [c for c in comps if c.kind != "unchanged"]
    out += [f"<details><summary>All {len(changed)} changed components ({main}; {len(comps) - len(changed)} unchanged)</summary>", ""]
    if changed:
        out += ["| component | type | kind | " + " | ".join(cdiff.LABELS[m] for m in REPORT_METRICS) + " |",
                "|---|---|---|" + "--:|" * len(REPORT_METRICS)]
        for c in changed[:MAX_TABLE_ROWS]:
            cells = [_delta_cell(c, m) for m in REPORT_METRICS]
            indent = "&nbsp;&nbsp;" * c.depth
            out.append(f"| {indent}{_path_cell(c, model)} | {_short(c.module_type)} | {c.kind} | " + " | ".join(cells) + " |")
        if len(changed) > MAX_TABLE_ROWS:
            out.append(f"\n{len(changed) - MAX_TABLE_ROWS} more rows on the diff page.")
    out += ["", "</details>", ""]

    if site_url:
        out += [f"[Open the diff page]({site_url})", ""]
    return "\n".join(out)


def _traffic_section(rd: RunDiff, phase: str, model: str) -> list[str]:
    """Sharded runs: the communicating components whose collective bytes changed (cbsite/traffic.py)."""
    changed = [t for t in rd.traffic if t.phase == phase and t.kind != "unchanged"]
    if not changed:
        return []
    out = [f"### Communication ({phase})", "", "| component | kind | sent | received | sent + received | collectives |",
           "|---|---|--:|--:|--:|---|"]
    for t, row in zip(changed, traffic.rows(changed, model)):
        cells = [f"{row[m]['base'] or '–'} → {row[m]['head'] or '–'} ({row[m]['change']})" for m in
                 ("comm_bytes_sent", "comm_bytes_received", "comm_bytes")]
        ops = f"{', '.join(t.collectives_base) or '–'} → {', '.join(t.collectives_head) or '–'}"
        out.append(f"| {_code(cdiff.display_path(t.path, model))} | {t.kind} | " + " | ".join(cells) + f" | {_escape(ops)} |")
    return out + [""]


def _latency_section(rd: RunDiff, latency: LatencyEvidence | None, phases: Sequence[str], model: str) -> list[str]:
    """The PR comment's latency verdicts: only regressed, improved and inconclusive components."""
    out = [latency_summary(latency, phases), ""]
    rows = latency_rows(latency, rd, phases)
    if rows:
        out += ["| component | phase | verdict | ratio | 95 % interval | note |", "|---|---|---|--:|--:|---|"]
        for ph, path, v in rows[:MAX_LATENCY_ROWS]:
            ratio, interval = _verdict_cells(v)
            note = _escape(v.reason) if v.verdict == "inconclusive" else ""
            out.append(f"| {_code(cdiff.display_path(path, model))} | {ph} | {v.verdict} | {ratio} | {interval} | {note} |")
        if len(rows) > MAX_LATENCY_ROWS:
            out.append(f"\n{len(rows) - MAX_LATENCY_ROWS} more on the diff page.")
        out.append("")
    flagged = sorted((ph, path, notes) for (path, ph), notes in (latency.flagged if latency else {}).items() if ph in phases)
    if flagged:
        shown = "; ".join(f"{_code(cdiff.display_path(path, model), table=False)} {ph}: {_escape(notes[0])}"
                          for ph, path, notes in flagged[:10])
        more = f"; and {len(flagged) - 10} more" if len(flagged) > 10 else ""
        out += [f"Timing flags (blocks that waited for a CPU during the session): {shown}{more}.", ""]
    return out


def to_json(rd: RunDiff, gate: GateResult | None, *, match_moved: bool, site_url: str | None = None,
            latency: LatencyEvidence | None = None) -> dict[str, Any]:
    """The diff (RunDiff.to_dict) plus how it was made and the gate's verdict; valid per diff.schema.json."""
    out = rd.to_dict()
    out["latency_evidence"] = None if latency is None else {
        "kind": latency.kind, "source": latency.source,
        "components": [{"path": path, "phase": ph, "verdict": v.to_dict()}
                       for (path, ph), v in sorted(latency.verdicts().items())],
    }
    out["throughput"] = throughput.diff_record(rd.base_meta, rd.head_meta)
    out["match_moved"] = match_moved
    out["site_url"] = site_url
    out["gate"] = None if gate is None else {
        "passed": gate.passed,
        "rules": [r.text for r in gate.rules],
        "breaches": [
            {"rule": b.rule.text, "phase": b.phase, "path": b.path, "base_path": b.base_path,
             "base": _finite(b.base), "head": _finite(b.head), "change": _finite(b.change), "verdict": b.verdict}
            for b in gate.breaches
        ],
        "unknown": list(gate.unknown),
        "not_judged": list(gate.not_judged),
    }
    return out


def print_table(rd: RunDiff, gate: GateResult | None, console: Any, *, phase: str | None = None,
                top: int = TOP_N, latency: LatencyEvidence | None = None) -> None:
    """The terminal report: the summary, totals, top contributors, moved modules, the gate (rich)."""
    from rich.markup import escape
    from rich.table import Table

    model = rd.head_meta.get("model", "?")
    main = main_phase(rd, phase)
    console.print(rd.summary(latency=root_verdicts(latency, rd), latency_counts=latency_counts(latency)),
                  markup=False, highlight=False)
    phases = [phase] if phase else rd.phases
    console.print(latency_summary(latency, phases), markup=False, highlight=False)
    rows = latency_rows(latency, rd, phases)
    if rows:
        verdict_table = Table("component", "phase", "verdict", "ratio", "95 % interval", "note", title="Latency verdicts")
        for ph, path, v in rows[:MAX_LATENCY_ROWS]:
            ratio, interval = _verdict_cells(v)
            verdict_table.add_row(escape(cdiff.display_path(path, model)), ph, v.verdict, ratio, interval,
                                  escape(v.reason if v.verdict == "inconclusive" else ""))
        console.print(verdict_table)
    totals = Table("metric", "phase", "base", "head", "change", "ratio", title=f"{_title(rd).replace('`', '')}")
    for metric in REPORT_METRICS:
        for ph in ([phase] if phase else rd.phases)[: 1 if metric == "param_bytes" else None]:
            t = rd.totals[ph][metric]
            totals.add_row(cdiff.LABELS[metric], "static" if metric == "param_bytes" else ph, _amount(metric, t.base), _amount(metric, t.head),
                           cdiff.format_delta(metric, t.delta), "within noise" if t.noise else cdiff.format_ratio(t))
    console.print(totals)
    contributors = Table("metric", "component", "type", "kind", "own change", "share", title=f"Where the change is ({main})")
    for metric in REPORT_METRICS:
        for c in rd.top(metric, main, top):
            share = c.share[metric]
            contributors.add_row(cdiff.LABELS[metric], escape(cdiff.display_path(c.path, model)), escape(_short(c.module_type)), c.kind,
                                 cdiff.format_delta(metric, c.self_delta[metric]), "" if share is None else _pct(share))
    if contributors.row_count:
        console.print(contributors)
    for c in rd.for_phase(main):
        if c.kind == "moved":
            console.print(f"moved: {c.base_path} -> {c.path} ({_short(c.module_type)})", markup=False, highlight=False)
    if gate is not None and gate.rules:
        for line in gate_text(gate, model):
            console.print(line, markup=False, highlight=False)


def schema_path() -> Path:
    """The JSON schema that `cbsite diff --format json` output follows (shipped in the package)."""
    return Path(__file__).with_name("diff.schema.json")


def gate_text(gate: GateResult, model: str) -> list[str]:
    """Plain lines for the terminal: one per broken rule and place, then what could not be judged."""
    lines = [_gate_line(gate, markdown=False)]
    for b in gate.breaches:
        lines.append(f"  {b.rule.text}: {b.phase} {_where(b, model)} {_amount(b.rule.metric, b.base)} -> "
                     f"{_amount(b.rule.metric, b.head)} ({_change(b)}{_interval(b)})")
    for u in gate.unknown:
        lines.append(f"  not judged: {u}")
    for n in gate.not_judged:
        lines.append(f"  {n}")
    return lines


def _gate_line(gate: GateResult, markdown: bool = True) -> str:
    n = len(gate.rules)
    skipped = len({line.split(":", 1)[0] for line in gate.not_judged})
    if gate.passed:
        judged = n - skipped
        text = f"gate passed: {judged} rule{'s' * (judged != 1)} held"
        if skipped:
            text += f", {skipped} latency rule{'s' * (skipped != 1)} not judged (no rounds or comparison)"
        return (f"✅ **Gate passed**: {text.split(': ', 1)[1]}." if markdown else text)
    broken = gate.broken_rules()
    names = ", ".join(f"`{r.text}`" if markdown else r.text for r in broken)
    text = f"{len(broken)} of {n} rule{'s' * (n != 1)} broken: {names}"
    return f"❌ **Gate failed**: {text}." if markdown else f"gate failed: {text}"


def _gate_section(gate: GateResult, model: str) -> list[str]:
    out = ["### Gate", "", "| rule | result |", "|---|---|"]
    for rule in gate.rules:
        hits = [b for b in gate.breaches if b.rule.text == rule.text]
        blind = any(line.startswith(f"{rule.text}: not judged") for line in gate.not_judged)
        verdict = f"❌ broken ({len(hits)})" if hits else ("➖ not judged" if blind else "✅ held")
        out.append(f"| `{rule.text}` | {verdict} |")
    if gate.breaches:
        out += ["", "| broken rule | phase | where | base | head | change |", "|---|---|---|--:|--:|--:|"]
        for b in gate.breaches:
            out.append(f"| `{b.rule.text}` | {b.phase} | {_where(b, model, code=True)} | {_amount(b.rule.metric, b.base)} | "
                       f"{_amount(b.rule.metric, b.head)} | {_change(b)} |")
    if gate.not_judged:
        out += ["", "Latency not judged: " + "; ".join(_escape(n) for n in gate.not_judged)]
    if gate.unknown:
        out += ["", "Not judged (values missing in a run): " + "; ".join(_md_text(u) for u in gate.unknown[:20])
                + (f"; and {len(gate.unknown) - 20} more" if len(gate.unknown) > 20 else "")]
    return out + [""]


def _title(rd: RunDiff) -> str:
    b, h = rd.base_meta, rd.head_meta
    if b.get("model") == h.get("model"):
        return f"`{h.get('model')}` {h.get('version')} vs {b.get('version')}"
    return f"`{h.get('model')}` {h.get('version')} vs `{b.get('model')}` {b.get('version')}"


def _where(b: Breach, model: str, code: bool = False) -> str:
    if b.path is None:
        return "total"
    text = cdiff.display_path(b.path, model)
    if b.base_path is not None and b.base_path != b.path:
        if code:
            return f"{_code(b.path)} (was {_code(b.base_path)})"
        text = f"{b.path} (was {b.base_path})"
    return _code(text) if code else text


def _change(b: Breach) -> str:
    """A breach's growth: "new", "+12%", or "3.4×" from doubling up (as diff.format_ratio writes ratios)."""
    if b.change is None:
        return "new"
    if b.change < 0:  # a drop rule (throughput)
        return cdiff.MINUS + _pct(-b.change)
    ratio = b.change + 1
    if ratio >= 2:
        return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"
    return "+" + _pct(b.change)


def _interval(b: Breach) -> str:
    """A latency breach's 95 % interval of the ratio, as evidence beside the estimate."""
    v = b.verdict
    if not v or v.get("ci_low") is None or v.get("ci_high") is None:
        return ""
    return f", 95 % interval {v['ci_low']:.3f}-{v['ci_high']:.3f}x over {v['n']} units"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _listing(items: list[ComponentDelta], model: str, limit: int = 30) -> str:
    shown = [f"{_code(cdiff.display_path(c.path, model), table=False)} ({_short(c.module_type)})" for c in items[:limit]]
    return ", ".join(shown) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _path_cell(c: ComponentDelta, model: str) -> str:
    return _code(cdiff.display_path(c.path, model))


def _code(text: str, table: bool = True) -> str:
    """`text` as a Markdown code span that shows it as written, whatever it holds: the fence is one backtick
    longer than the longest run of backticks inside (CommonMark), padded with a space where the text starts
    or ends with one; in a table cell the pipe is escaped as GFM requires even inside code."""
    text = " ".join(text.splitlines()) or " "
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " " and text.strip()) else ""
    out = f"{fence}{pad}{text}{pad}{fence}"
    return out.replace("|", "\\|") if table else out


def _md_text(text: str) -> str:
    """Plain Markdown text that shows as written: ASCII punctuation Markdown reads is backslash-escaped."""
    return re.sub(r"([\\`*_\[\]<>|~&])", r"\\\1", " ".join(text.splitlines()))


def _delta_cell(c: ComponentDelta, metric: str) -> str:
    if c.delta[metric] is None:
        return "n/a"
    if not c.delta[metric]:
        return ""
    text = cdiff.format_delta(metric, c.delta[metric])
    return f"{text} (noise)" if c.noise[metric] else text


def _amount(metric: str, value: float | None) -> str:
    if metric in throughput.RULE_METRICS:
        return throughput.format_rate(value)
    return "n/a" if value is None else cdiff.format_amount(metric, value)


def _short(module_type: str) -> str:
    return _escape(module_type.rsplit(".", 1)[-1])


def _pct(fraction: float) -> str:
    pct = fraction * 100
    return f"{pct:.0f}%" if abs(pct) >= 10 else f"{pct:.2g}%"


def _escape(text: str) -> str:
    """A table cell must not end early: escape the pipe (paths are FQNs, but module types come from users)."""
    return text.replace("|", "\\|")


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
