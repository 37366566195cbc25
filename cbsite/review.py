"""A diff and its gate in words for people: the PR comment (Markdown), the terminal report (rich), the JSON
output, and the diff page's address. Renderers only: the gate's rules and judgements are cbsite/gate.py, the
diff's data cbsite/diff/rundiff.py, numbers as text cbsite/format.py.

Core module: no torch, no jinja2. `cbsite diff` (the CLI) is a thin caller of what is here.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cbsite import format as cfmt
from cbsite import throughput
from cbsite.archive import RunRef, list_runs
from cbsite.diff import traffic
from cbsite.diff.comparison import CHANGE_WORDS, NOT_JUDGED, NOT_JUDGED_HINT, LatencyEvidence, judgement
from cbsite.diff.record import LABELS, NO_SHARE, ComponentDelta, display_path, short_type
from cbsite.diff.rundiff import RunDiff
from cbsite.diff.summary import capitalise, total_parts
from cbsite.gate import Breach, GateResult, latency_counts, root_verdicts

TOP_N = 5  # contributors per metric in the Markdown summary
MAX_TABLE_ROWS = 300  # rows of the collapsible full table; a PR comment holds at most 65,536 characters


# --- the diff page on the site --------------------------------------------------------------------


def diff_page_url(site_url: str, base: RunRef, head: RunRef, runs: Path) -> str:
    """The address of the diff page of these two runs on a site built from the archive `runs`.

    The generator's scheme (cbsite/generator/templating.py `diff_url`, catalog.py): the newest runs of two
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
    pairs = itertools.pairwise(versions)
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
        text += f"; noise (spread of units) median {cfmt.pct2(spreads[len(spreads) // 2])}"
    if detect:
        text += f", smallest detectable change median {cfmt.pct2(detect[len(detect) // 2])}"
    return text + "."


def _verdict_cells(v: Any) -> tuple[str, str]:
    ratio = "n/a" if v.ratio is None else cfmt.ratio3(v.ratio)
    interval = "" if v.ci_low is None or v.ci_high is None else f"{cfmt.ratio3(v.ci_low, '')}–{cfmt.ratio3(v.ci_high)}"
    return ratio, interval


LEAD_ROWS = 3  # rows per table above the PR comment's fold
GROWTH_METRICS = ("flops", "param_bytes", "peak_memory_bytes")  # the contributors shown above the fold


def markdown(rd: RunDiff, gate: GateResult | None = None, *, phase: str | None = None,
             site_url: str | None = None, top: int = TOP_N, latency: LatencyEvidence | None = None) -> str:
    """GitHub-flavoured Markdown for a PR comment: about 40 lines a reviewer reads (the gate and its broken
    rules, the totals in one sentence, the judged latency changes, the top FLOP and memory growth, setup
    changes), then everything else inside one `<details>` fold."""
    model = rd.head_meta.get("model", "?")
    main = main_phase(rd, phase)
    phases = [phase] if phase else rd.phases
    out = [f"## cbsite: {_title(rd)}", ""]
    if gate is not None and gate.rules:
        out += [_gate_line(gate), ""] + _breaches_table(gate, model, LEAD_ROWS)
    clauses = rd.clauses(latency=root_verdicts(latency, rd), latency_counts=latency_counts(latency))
    out += [capitalise(", ".join(total_parts(clauses))) + ".", ""]
    out += _latency_lead(rd, latency, phases, model)
    out += _growth_lead(rd, main, model)
    out += _setup_lines(rd, main)
    if site_url:
        out += [f"[Open the diff page]({site_url})", ""]
    out += ["<details><summary>Details: totals, where every change is, all changed components</summary>", ""]
    out += _details(rd, gate, latency, main, phases, model, top)
    out += ["</details>", ""]
    return "\n".join(out)


def _breaches_table(gate: GateResult, model: str, limit: int) -> list[str]:
    """The broken rules' largest breaches (the full list is in the fold's gate section)."""
    if not gate.breaches:
        return []
    out = ["| broken rule | phase | where | base | head | change |", "|---|---|---|--:|--:|--:|"]
    for b in gate.breaches[:limit]:
        out.append(f"| `{b.rule.text}` | {b.phase} | {_where(b, model, code=True)} | {_amount(b.rule.metric, b.base)} | "
                   f"{_amount(b.rule.metric, b.head)} | {_change(b)} |")
    if len(gate.breaches) > limit:
        out.append(f"\nand {len(gate.breaches) - limit} more breaches in the details.")
    return out + [""]


def _latency_lead(rd: RunDiff, latency: LatencyEvidence | None, phases: Sequence[str], model: str) -> list[str]:
    """The judged latency: per phase the whole model and the largest judged changes, with ratio and interval;
    unjudged latency is one line that says how to judge it."""
    if latency is None:
        return [f"Latency {NOT_JUDGED}: {NOT_JUDGED_HINT}.", ""]
    verdicts = latency.verdicts()
    own = {(c.path, c.phase): c.self_delta["latency_ms"] for c in rd.components}
    out = ["| latency | phase | judgement | ratio | 95 % interval |", "|---|---|---|--:|--:|"]
    for ph in phases:
        # The whole model, then the judged changes that are a component's own (not a container repeating its child's).
        rows = [("", verdicts.get(("", ph)))]
        rows += [(path, v) for _, path, v in latency_rows(latency, rd, [ph])
                 if path != "" and v.verdict in CHANGE_WORDS and own.get((path, ph)) not in (None, 0)][:LEAD_ROWS - 1]
        for path, v in rows:
            ratio, interval = _verdict_cells(v) if v is not None else ("n/a", "")
            out.append(f"| {_code(display_path(path, model))} | {ph} | {judgement(v, latency.floor)} | {ratio} | {interval} |")
    return out + ["", latency_summary(latency, phases), ""]


def _growth_lead(rd: RunDiff, main: str, model: str) -> list[str]:
    """The top contributors of FLOP and memory growth (own changes), shares only where they add up."""
    rows = []
    for metric in GROWTH_METRICS:
        t = rd.totals[main][metric]
        if not t.delta:
            continue
        for c in rd.top(metric, main, LEAD_ROWS):
            rows.append(f"| {LABELS[metric]} | {_path_cell(c, model)} | {_short(c.module_type)} | {_kind(c, metric)} | "
                        f"{cfmt.delta(metric, c.self_delta[metric])} | {_share_cell(rd, c, metric, main)} |")
    if not rows:
        return []
    return [f"Where FLOPs and memory changed ({main}, own changes):", "",
            "| metric | component | type | kind | own change | share |", "|---|---|---|---|--:|--:|"] + rows + [""]


def _setup_lines(rd: RunDiff, main: str) -> list[str]:
    """What differs in how the runs were made or what they hold: warnings, added, removed and moved modules."""
    counts = rd.counts(main)
    moves = [f"{counts[k]} {k}" for k in ("added", "removed", "moved") if counts[k]]
    lines = [f"- {capitalise(w)}." for w in rd.warnings]
    if moves:
        lines.append(f"- Modules ({main}): {', '.join(moves)} (listed in the details).")
    return (["Setup changes:", ""] + lines + [""]) if lines else []


def _details(rd: RunDiff, gate: GateResult | None, latency: LatencyEvidence | None, main: str,
             phases: Sequence[str], model: str, top: int) -> list[str]:
    """The fold: the summary paragraph, totals, latency verdicts, contributors, modules, traffic, gate, the tree."""
    counts = latency_counts(latency)
    out = [rd.summary(latency=root_verdicts(latency, rd), latency_counts=counts), ""]
    out += _totals_table(rd, latency, phases)
    out += _latency_section(rd, latency, phases, model)
    out += _contributors(rd, main, model, top, counts, latency is not None)
    out += _modules_section(rd, main, model)
    out += _traffic_section(rd, main, model)
    if gate is not None and gate.rules:
        out += _gate_section(gate, model)
    if steps := throughput.changes(rd.base_meta, rd.head_meta):
        out += [throughput.sentence(list(steps.values())) + ".", ""]
    return out + _changed_tree(rd, main, model)


def _totals_table(rd: RunDiff, latency: LatencyEvidence | None, phases: Sequence[str]) -> list[str]:
    judged = root_verdicts(latency, rd) or {}
    out = ["| metric | phase | base | head | change | ratio | judgement |", "|---|---|--:|--:|--:|--:|---|"]
    for metric in REPORT_METRICS:
        for ph in phases[:1] if metric == "param_bytes" else phases:
            t = rd.totals[ph][metric]
            word = total_judgement(metric, ph, judged, latency is not None)
            incomplete = "" if t.complete else " (incomplete)"
            out.append(f"| {LABELS[metric]}{incomplete} | {ph if metric != 'param_bytes' else 'static'} | "
                       f"{_amount(metric, t.base)} | {_amount(metric, t.head)} | {cfmt.delta(metric, t.delta)} | "
                       f"{cfmt.change(t.base, t.head)} | {word} |")
    return out + [""]


def total_judgement(metric: str, phase: str, judged: dict[str, str], has_evidence: bool) -> str:
    """The judgement cell of a total: latency's verdict word (the one story), nothing for exact counts."""
    if metric != "latency_ms":
        return ""
    return judged.get(phase, "not judged") if has_evidence else NOT_JUDGED


def _contributors(rd: RunDiff, main: str, model: str, top: int, counts: Any, judged: bool) -> list[str]:
    """Per metric the components with the largest own change; unjudged latency has none (no finding)."""
    sections = []
    for metric in REPORT_METRICS:
        t = rd.totals[main][metric]
        if metric == "latency_ms" and not judged:
            continue
        rows = rd.top(metric, main, top, counts if metric == "latency_ms" else None)
        if not rows or not t.delta:
            continue
        lines = [f"**{capitalise(LABELS[metric])}** {cfmt.delta(metric, t.delta)} ({cfmt.change(t.base, t.head)})",
                 "", "| component | type | kind | own change | share |", "|---|---|---|--:|--:|"]
        for c in rows:
            lines.append(f"| {_path_cell(c, model)} | {_short(c.module_type)} | {_kind(c, metric)} | "
                         f"{cfmt.delta(metric, c.self_delta[metric])} | {_share_cell(rd, c, metric, main)} |")
        sections.append("\n".join(lines))
    return [f"### Where the change is ({main})", "", "\n\n".join(sections), ""] if sections else []


def _modules_section(rd: RunDiff, main: str, model: str) -> list[str]:
    comps = rd.for_phase(main)
    moved = [c for c in comps if c.kind == "moved"]
    added = [c for c in comps if c.kind == "added"]
    removed = [c for c in comps if c.kind == "removed"]
    if not (moved or added or removed):
        return []
    out = ["### Modules", ""]
    for label, items in (("Added", added), ("Removed", removed)):
        if items:
            out.append(f"- **{label}** ({len(items)}): " + _listing(items, model))
    if moved:
        out.append(f"- **Moved** ({len(moved)}), matched by structure:")
        for c in moved[:50]:
            changes = [f"{LABELS[m]} {cfmt.delta(m, c.delta[m])}" for m in REPORT_METRICS
                       if c.delta[m] and not c.noise[m]]
            out.append(f"  - {_code(c.base_path or '', table=False)} → {_code(c.path, table=False)} ({_short(c.module_type)})"
                       + (": " + ", ".join(changes) if changes else ""))
        if len(moved) > 50:
            out.append(f"  - and {len(moved) - 50} more")
    return out + [""]


def _changed_tree(rd: RunDiff, main: str, model: str) -> list[str]:
    """Every changed component in pre-order, indented by its changed ancestors only, so a component whose
    parent is unchanged (and not listed) never reads as the child of the row above."""
    comps = rd.for_phase(main)
    changed = [c for c in comps if c.kind != "unchanged"]
    out = [f"All {len(changed)} changed components ({main}; {len(comps) - len(changed)} unchanged):", ""]
    if not changed:
        return out
    out += ["| component | type | kind | " + " | ".join(LABELS[m] for m in REPORT_METRICS) + " |",
            "|---|---|---|" + "--:|" * len(REPORT_METRICS)]
    listed = {c.path for c in changed[:MAX_TABLE_ROWS]}
    for c in changed[:MAX_TABLE_ROWS]:
        cells = [_delta_cell(c, m) for m in REPORT_METRICS]
        indent = "&nbsp;&nbsp;" * sum(a in listed for a in _ancestors(c.path))
        out.append(f"| {indent}{_path_cell(c, model)} | {_short(c.module_type)} | {c.kind} | " + " | ".join(cells) + " |")
    if len(changed) > MAX_TABLE_ROWS:
        out.append(f"\n{len(changed) - MAX_TABLE_ROWS} more rows on the diff page.")
    return out + [""]


def _ancestors(path: str) -> list[str]:
    """The FQNs above `path`: the root "" and each dotted prefix."""
    if path == "":
        return []
    parts = path.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts))]


def _kind(c: ComponentDelta, metric: str) -> str:
    """A component's kind as a table of one metric shows it: increased or decreased follow the sign of the
    own change beside it, so a kind never contradicts its sign; added, removed and moved stay."""
    own = c.self_delta[metric]
    if c.kind in ("increased", "decreased", "unchanged") and own:
        return "increased" if own > 0 else "decreased"
    return c.kind


def _share_cell(rd: RunDiff, c: ComponentDelta, metric: str, phase: str) -> str:
    """A share only where it means something: additive metrics, between 0 and 100 %, no cancelling changes."""
    share = c.share[metric]
    if share is None or metric in NO_SHARE or not cfmt.share_fits(share) or rd.cancelled(metric, phase) is not None:
        return ""
    return cfmt.pct2(share)


def _traffic_section(rd: RunDiff, phase: str, model: str) -> list[str]:
    """Sharded runs: the communicating components whose collective bytes changed (cbsite/diff/traffic.py)."""
    changed = [t for t in rd.traffic if t.phase == phase and t.kind != "unchanged"]
    if not changed:
        return []
    out = [f"### Communication ({phase})", "", "| component | kind | sent | received | sent + received | collectives |",
           "|---|---|--:|--:|--:|---|"]
    for t, row in zip(changed, traffic.rows(changed, model)):
        cells = [f"{row[m]['base'] or '–'} → {row[m]['head'] or '–'} ({row[m]['change']})" for m in
                 ("comm_bytes_sent", "comm_bytes_received", "comm_bytes")]
        ops = f"{', '.join(t.collectives_base) or '–'} → {', '.join(t.collectives_head) or '–'}"
        out.append(f"| {_code(display_path(t.path, model))} | {t.kind} | " + " | ".join(cells) + f" | {_escape(ops)} |")
    return out + [""]


def _latency_section(rd: RunDiff, latency: LatencyEvidence | None, phases: Sequence[str], model: str) -> list[str]:
    """The PR comment's latency verdicts: only regressed, improved and inconclusive components."""
    out = [latency_summary(latency, phases), ""]
    rows = latency_rows(latency, rd, phases)
    if rows:
        out += ["| component | phase | verdict | ratio | 95 % interval | note |", "|---|---|---|--:|--:|---|"]
        for ph, path, v in rows[:MAX_LATENCY_ROWS]:
            ratio, interval = _verdict_cells(v)
            word = judgement(v, latency.floor) if latency is not None else v.verdict
            note = _escape(v.reason) if word == "inconclusive" else ""
            out.append(f"| {_code(display_path(path, model))} | {ph} | {word} | {ratio} | {interval} | {note} |")
        if len(rows) > MAX_LATENCY_ROWS:
            out.append(f"\n{len(rows) - MAX_LATENCY_ROWS} more on the diff page.")
        out.append("")
    flagged = sorted((ph, path, notes) for (path, ph), notes in (latency.flagged if latency else {}).items() if ph in phases)
    if flagged:
        shown = "; ".join(f"{_code(display_path(path, model), table=False)} {ph}: {_escape(notes[0])}"
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
    # One latency story: the summary and each phase's latency judgement as the Markdown and the terminal say them.
    judged = root_verdicts(latency, rd) or {}
    out["summary"] = rd.summary(latency=root_verdicts(latency, rd), latency_counts=latency_counts(latency))
    out["latency_judgement"] = {ph: total_judgement("latency_ms", ph, judged, latency is not None) for ph in rd.phases}
    out["throughput"] = throughput.diff_record(rd.base_meta, rd.head_meta)
    out["match_moved"] = match_moved
    out["site_url"] = site_url
    out["gate"] = None if gate is None else {
        "passed": gate.passed,
        "rules": [r.text for r in gate.rules],
        "breaches": [
            {"rule": b.rule.text, "phase": b.phase, "path": b.path, "base_path": b.base_path,
             "base": cfmt.json_safe(b.base), "head": cfmt.json_safe(b.head), "change": cfmt.json_safe(b.change), "verdict": b.verdict}
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
            word = judgement(v, latency.floor if latency else 0.0)
            verdict_table.add_row(escape(display_path(path, model)), ph, word, ratio, interval,
                                  escape(v.reason if word == "inconclusive" else ""))
        console.print(verdict_table)
    judged = root_verdicts(latency, rd) or {}
    totals = Table("metric", "phase", "base", "head", "change", "ratio", "judgement", title=f"{_title(rd).replace('`', '')}")
    for metric in REPORT_METRICS:
        for ph in ([phase] if phase else rd.phases)[: 1 if metric == "param_bytes" else None]:
            t = rd.totals[ph][metric]
            name = LABELS[metric] + ("" if t.complete else " (incomplete)")
            totals.add_row(name, "static" if metric == "param_bytes" else ph, _amount(metric, t.base), _amount(metric, t.head),
                           cfmt.delta(metric, t.delta), cfmt.change(t.base, t.head),
                           total_judgement(metric, ph, judged, latency is not None))
    console.print(totals)
    contributors = Table("metric", "component", "type", "kind", "own change", "share", title=f"Where the change is ({main})")
    counts = latency_counts(latency)
    for metric in REPORT_METRICS:
        if metric == "latency_ms" and latency is None:
            continue  # unjudged latency is no finding to attribute
        for c in rd.top(metric, main, top, counts if metric == "latency_ms" else None):
            contributors.add_row(LABELS[metric], escape(display_path(c.path, model)), escape(_short(c.module_type)),
                                 _kind(c, metric), cfmt.delta(metric, c.self_delta[metric]), _share_cell(rd, c, metric, main))
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
    return Path(__file__).parent / "diff" / "diff.schema.json"


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
    text = display_path(b.path, model)
    if b.base_path is not None and b.base_path != b.path:
        if code:
            return f"{_code(b.path)} (was {_code(b.base_path)})"
        text = f"{b.path} (was {b.base_path})"
    return _code(text) if code else text


def _change(b: Breach) -> str:
    """A breach's growth: "new", "+12%", or "3.4×" from doubling up (as format.change writes ratios)."""
    if b.change is None:
        return "new"
    if b.change < 0:  # a drop rule (throughput)
        return cfmt.MINUS + cfmt.pct2(-b.change)
    ratio = b.change + 1
    if ratio >= 2:
        return cfmt.times(ratio)
    return "+" + cfmt.pct2(b.change)


def _interval(b: Breach) -> str:
    """A latency breach's 95 % interval of the ratio, as evidence beside the estimate."""
    v = b.verdict
    if not v or v.get("ci_low") is None or v.get("ci_high") is None:
        return ""
    return f", 95 % interval {cfmt.ratio3(v['ci_low'], '')}-{cfmt.ratio3(v['ci_high'], 'x')} over {v['n']} units"


def _listing(items: list[ComponentDelta], model: str, limit: int = 30) -> str:
    shown = [f"{_code(display_path(c.path, model), table=False)} ({_short(c.module_type)})" for c in items[:limit]]
    return ", ".join(shown) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _path_cell(c: ComponentDelta, model: str) -> str:
    return _code(display_path(c.path, model))


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
    text = cfmt.delta(metric, c.delta[metric])
    return f"{text} (noise)" if c.noise[metric] else text


def _amount(metric: str, value: float | None) -> str:
    if metric in throughput.RULE_METRICS:
        return cfmt.examples_rate(value)
    return "n/a" if value is None else cfmt.amount(metric, value)


def _short(module_type: str) -> str:
    return _escape(short_type(module_type))


def _escape(text: str) -> str:
    """A table cell must not end early: escape the pipe (paths are FQNs, but module types come from users)."""
    return text.replace("|", "\\|")

