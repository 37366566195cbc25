"""The PR comment (review.markdown): what a reviewer reads above the fold (the gate, the totals in one short
sentence, the judged latency changes, the top FLOP and memory growth, setup changes) in about 40 lines, the rest in
one `<details>` fold; its golden file; and its GitHub-flavoured Markdown rendered in a real browser.

Regenerate the golden file after an intended change (`make golden`), then review `git diff tests/golden/`:
    CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_pr_comment.py
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from cbsite import gate as cgate
from cbsite import review
from cbsite.diff.comparison import LatencyEvidence
from cbsite.diff.rundiff import diff_runs
from tests.helpers.runfactory import make_run

GOLDEN = Path(__file__).parent / "golden" / "pr_comment.md"
REGEN = os.environ.get("CBSITE_REGEN_GOLDEN") == "1"
MAX_LEAD_LINES = 40

# Two towers; the head renames user.mlp.0 (matched as moved, under parents that do not change) and widens item.mlp.0.
BASE_SPEC = {"": {"user": {"user.mlp": {"user.mlp.0": None, "user.mlp.1": None}}, "item": {"item.mlp": {"item.mlp.0": None}}}}
HEAD_SPEC = {"": {"user": {"user.mlp": {"user.mlp.first": None, "user.mlp.1": None}}, "item": {"item.mlp": {"item.mlp.0": None}}}}
LEAF = {"flops": 100_000, "latency_ms": 0.1, "bytes_moved": 4_000, "param_bytes": 40_000, "peak_memory_bytes": 50_000}
WIDER = {**LEAF, "flops": 400_000, "latency_ms": 0.3, "param_bytes": 160_000, "peak_memory_bytes": 120_000}


def _units(base: float | None, head: float | None) -> list[float]:
    """Six processes' log ratios around head/base (0 where a side is missing), with a little spread."""
    centre = math.log(head / base) if base and head else 0.0
    return [centre + d for d in (0.004, -0.003, 0.002, -0.004, 0.001, 0.0)]


def _comment(gate_rules: list[str] | None = None) -> str:
    base = make_run(BASE_SPEC, model="twotower", version="v1", run_id="20250101T000000Z-00000a",
                    metrics={p: LEAF for p in ("user.mlp.0", "user.mlp.1", "item.mlp.0")})
    head = make_run(HEAD_SPEC, model="twotower", version="v2", run_id="20250102T000000Z-00000b",
                    metrics={"user.mlp.first": LEAF, "user.mlp.1": LEAF, "item.mlp.0": WIDER})
    rd = diff_runs(base, head, match_moved=True)
    evidence = LatencyEvidence(kind="paired", source="20250102T000000Z-c0ffee")
    for phase in rd.phases:
        for c in rd.for_phase(phase):
            evidence.units[(c.path, phase)] = _units(c.base["latency_ms"], c.head["latency_ms"])
    rules = cgate.parse_rules(gate_rules or ["flops>+40%", "*:latency>+20%", "peak_memory>+10%"])
    gate = cgate.check(rd, rules, latency=evidence)
    return review.markdown(rd, gate, latency=evidence, site_url="https://example.org/pr-7/diffs/twotower/v1/v2/")


def test_pr_comment_matches_the_golden_file() -> None:
    out = _comment()
    if REGEN:
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text(), "regenerate with CBSITE_REGEN_GOLDEN=1 (make golden) and review the diff"


def test_what_a_reviewer_needs_is_above_the_fold_in_about_forty_lines() -> None:
    out = _comment()
    lead, fold = out.split("<details>", 1)
    lines = lead.rstrip("\n").splitlines()
    assert len(lines) <= MAX_LEAD_LINES, len(lines)
    assert lines[2].startswith("❌ **Gate failed**") and "`flops>+40%`" in lines[2]
    # The first paragraph after the gate is one short sentence of totals, latency with its verdict.
    summary = next(line for line in lines if line.startswith("2.0× parameter memory"))
    assert len(summary) < 400 and "regressed" in summary and "within noise" not in summary
    # Judged latency: the whole model and the largest change per phase, ratio and interval.
    for phase in ("forward", "backward"):
        assert any(line.startswith(f"| `twotower` | {phase} | regressed |") for line in lines)
        row = next(line for line in lines if line.startswith(f"| `item.mlp.0` | {phase} | regressed |"))
        assert "×" in row and "–" in row
    # FLOP and memory growth: the widened layer, peak memory without a share.
    assert any(line.startswith("| FLOPs | `item.mlp.0` |") and line.endswith("| 100% |") for line in lines)
    peak = next(line for line in lines if line.startswith("| peak memory | `item.mlp.0` |"))
    assert peak.endswith("|  |")
    assert "[Open the diff page](https://example.org/pr-7/diffs/twotower/v1/v2/)" in lead
    # Everything else is folded: totals, the gate's rules, the tree of changed components.
    assert "| metric | phase | base | head | change | ratio | judgement |" in fold and "### Gate" in fold
    assert fold.rstrip().endswith("</details>")


def test_the_tree_of_changed_components_indents_by_its_listed_ancestors() -> None:
    out = _comment()
    tree = out.split("changed components (forward", 1)[1]
    rows = {line.split("`")[1]: line.split("|")[1].count("&nbsp;&nbsp;") for line in tree.splitlines() if "`" in line}
    # user and user.mlp are unchanged and not listed: the moved leaf sits one step under the root, not three.
    assert rows["twotower"] == 0 and rows["user.mlp.first"] == 1
    assert rows["item"] == 1 and rows["item.mlp"] == 2 and rows["item.mlp.0"] == 3


@pytest.mark.browser
def test_the_comment_renders_as_github_flavoured_markdown(page) -> None:
    import markdown

    html = markdown.markdown(_comment(), extensions=["tables"])
    page.set_content(f"<!doctype html><html><body>{html}</body></html>")
    assert page.locator("table").count() >= 3
    cell = page.locator("td", has_text="item.mlp.0").first
    assert cell.is_visible()
    assert page.locator("th", has_text="judgement").first.is_visible()
    assert page.locator("td", has_text="regressed").first.is_visible()
    summary = page.locator("details > summary")
    assert summary.count() == 1 and summary.is_visible() and "Details" in summary.inner_text()
    assert not page.locator("details").evaluate("d => d.open")
    summary.click()
    assert page.locator("details").evaluate("d => d.open")
    assert page.errors == []
