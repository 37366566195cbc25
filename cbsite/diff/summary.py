"""A diff's summary clauses (cbsite/diff/clauses.py) in words: the one paragraph that the terminal, the PR comment,
the JSON output and the diff page print, and each clause alone for the home page. A clause never starts with a
path, so no path is ever capitalised."""

from __future__ import annotations

from collections.abc import Sequence

from cbsite import format as cfmt
from cbsite import throughput
from cbsite.diff.clauses import Clause
from cbsite.diff.record import LABELS, display_path, short_type

# Singular form used in "the FLOP growth".
GROWTH_LABELS = {**LABELS, "flops": "FLOP"}


def paragraph(clauses: Sequence[Clause]) -> str:
    """The summary: totals with ratios, where the change is, counts, what lacks numbers, throughput, warnings."""
    first = clauses[0]
    title = _title(first)
    if first.kind == "nothing":
        return f"{title}: no phase in common, nothing compared. " + " ".join(
            (c.text or "") + "." for c in clauses if c.kind == "warning")
    model = first.model or "?"
    sentences = [f"{title}: {', '.join(total_parts(clauses))}."]
    where = [clause_text(c, model) for c in clauses if c.kind == "where"]
    if where:
        sentences.append(capitalise("; ".join(where)) + ".")
    sentences += [capitalise(clause_text(c, model)) + "." for c in clauses if c.kind not in ("title", "total", "where")]
    return " ".join(sentences)


def total_parts(clauses: Sequence[Clause]) -> list[str]:
    """The first sentence's parts in order: each total that changed, then those within noise together, latency
    without a decision grouped by its judgement ("forward and backward latency not judged (single round)"), the
    unchanged ones together, the unknown ones together."""
    totals = [c for c in clauses if c.kind == "total"]
    parts = [total_text(c) for c in totals if c.status == "changed"]
    noisy = [total_text(c) for c in totals if c.status == "noise"]
    if noisy:
        parts.append(f"{', '.join(noisy)} within noise")
    undecided = [c for c in totals if c.status == "undecided"]
    for verdict in dict.fromkeys(c.verdict for c in undecided):
        group = [c for c in undecided if c.verdict == verdict]
        if all(c.metric == group[0].metric for c in group):  # "forward and backward latency not judged (...)"
            parts.append(f"{' and '.join(str(c.phase) for c in group)} {LABELS[group[0].metric or '']} {verdict}")
        else:
            parts.append(f"{', '.join(total_label(c) for c in group)} {verdict}")
    for status, word in (("unchanged", "unchanged"), ("unknown", "unknown")):
        named = [total_label(c) for c in totals if c.status == status]
        if named:
            parts.append(f"{word} {', '.join(named)}")
    return parts


def total_label(c: Clause) -> str:
    """"parameter memory" (static), else the phase and the metric: "forward latency"."""
    assert c.metric is not None  # every total clause names its metric
    return LABELS[c.metric] if c.metric == "param_bytes" else f"{c.phase} {LABELS[c.metric]}"


def total_text(c: Clause) -> str:
    """A total in words: "2.9× forward FLOPs (+12.6 MFLOP)", "+5% forward latency (+1.2 ms, regressed)",
    "forward latency (+0.1 ms)" (within noise), "forward latency not judged (single round)"."""
    label = total_label(c)
    assert c.metric is not None  # every total clause names its metric
    if c.status == "changed":
        verdict = f", {c.verdict}" if c.verdict is not None else ""
        return f"{cfmt.change(c.base, c.head)} {label} ({cfmt.delta(c.metric, c.amount)}{verdict})"
    if c.status == "noise":
        return f"{label} ({cfmt.delta(c.metric, c.amount)})"
    if c.status == "undecided":
        return f"{label} {c.verdict}"
    return label


def clause_text(c: Clause, model: str) -> str:
    """Any clause but the title and the totals in words, uncapitalised and without its full stop."""
    if c.kind == "where":
        return where_text(c, model)
    if c.kind == "counts":
        return f"{c.phase} components: {', '.join(f'{n} {k}' for k, n in c.counts)}"
    if c.kind == "flagged":
        names = [display_path(p, model) for p in c.paths]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return (f"{len(names)} component{'s' * (len(names) != 1)} lack numbers in a run "
                f"(failed, skipped or not measured), so some deltas are unknown: {shown}")
    if c.kind == "step":
        return throughput.sentence(list(c.steps))
    return c.text or ""


def where_text(c: Clause, model: str) -> str:
    """Where a total's change is, in one clause that starts with a word, never with a path."""
    metric, own = c.metric, c.amount
    assert metric is not None and c.phase is not None  # every where clause names its metric and phase
    label = (f"{c.phase} " if c.named_phase else "") + GROWTH_LABELS[metric]
    what = f"{label} {'growth' if c.growing else 'reduction'}"
    if c.form == "cancelled":
        return (f"{(c.phase + ' ') if c.named_phase else ''}{LABELS[metric]}: own changes cancel out "
                f"({cfmt.delta(metric, c.up)} up, {cfmt.delta(metric, c.down)} down, {cfmt.delta(metric, c.amount)} net"
                + ("" if c.complete else "; some own changes unknown") + ")")
    if c.form == "tie":
        names = [display_path(p, model) for p in c.paths]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        if c.share is not None and cfmt.share_fits(c.share * len(names)):
            each = f"{cfmt.share(c.share)} each, {cfmt.share(c.share * len(names))} together"
        else:
            each = f"{cfmt.delta(metric, own)} each"
        if c.share is None:
            return f"{len(names)} components tie for the largest own {what} ({each}): {shown}"
        return f"{len(names)} components tie for the largest part of the {what} ({each}): {shown}"
    name = display_path(c.path or "", model) + (" (own)" if c.path == "" else "")
    if c.form == "own":
        return f"the largest own {what} is in {name} ({short_type(c.module_type or '')}, {cfmt.delta(metric, own)})"
    assert c.share is not None  # the forms left (offset, most, largest) are those with a share
    if c.form == "offset":
        return (f"the largest own {what} is in {name} ({cfmt.delta(metric, own)}, more than the whole "
                f"model's {cfmt.delta(metric, c.total)}: partly offset elsewhere)")
    if c.form == "most":
        return f"most of the {what} ({cfmt.share(c.share)}) is in {name} ({short_type(c.module_type or '')})"
    return f"the largest part of the {what} ({cfmt.share(c.share)}) is in {name}"


def capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _title(c: Clause) -> str:
    if c.base_model == c.model:
        return f"{c.model} {c.version} vs {c.base_version}"
    return f"{c.model} {c.version} vs {c.base_model} {c.base_version}"
