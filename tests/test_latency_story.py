"""One latency story: every report (terminal, Markdown, JSON, the site's data) says the same judgement of a latency
change: the comparison's verdict where there is one, "not judged (single round)" otherwise, never the within-run
noise rule beside a verdict; shares only for additive metrics; a never-called module leaves the totals complete."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from cbsite import review, stats
from cbsite.cli import main
from cbsite.diff import comparison
from cbsite.diff.rundiff import diff_runs
from tests.helpers.runfactory import make_run

SPEC = {"": {"tower": {"tower.0": None, "tower.1": None}, "drop": None}}
LEAF = {"flops": 100_000, "latency_ms": 0.1, "bytes_moved": 4_000, "param_bytes": 40_000, "peak_memory_bytes": 50_000}
NEVER_CALLED = {"status": "skipped", "call_count": 0, "error": "never called during the forward pass"}


def _pair(head_leaf: dict[str, object]) -> tuple[object, object]:
    base = make_run(SPEC, model="tt", version="v1", metrics={"tower.0": LEAF, "tower.1": LEAF, "drop": NEVER_CALLED})
    head = make_run(SPEC, model="tt", version="v2",
                    metrics={"tower.0": {**LEAF, **head_leaf}, "tower.1": LEAF, "drop": NEVER_CALLED})
    return base, head


def _terminal(rd, evidence=None) -> str:
    out = io.StringIO()
    review.print_table(rd, None, Console(file=out, width=200), latency=evidence)
    return out.getvalue()


def test_single_round_latency_is_not_judged_in_every_report() -> None:
    base, head = _pair({"latency_ms": 0.3, "flops": 300_000})
    rd = diff_runs(base, head)
    word = comparison.NOT_JUDGED
    md = review.markdown(rd)
    data = review.to_json(rd, None, match_moved=False)
    terminal = _terminal(rd)
    for text in (md, data["summary"], terminal, rd.summary()):
        assert word in text and "within noise" not in text
    assert data["latency_judgement"] == {"forward": word, "backward": word}
    latency_rows = [line for line in terminal.splitlines() if line.lstrip("│ ").startswith("latency")]
    assert latency_rows and all(word in line for line in latency_rows)
    # Unjudged latency is no finding: not attributed to a component in the summary.
    assert "latency growth" not in rd.summary()


def test_a_never_called_module_leaves_the_totals_complete() -> None:
    base, head = _pair({"flops": 300_000})
    rd = diff_runs(base, head)
    assert rd.get("drop").status_head == "skipped"
    assert all(t.complete for totals in rd.totals.values() for t in totals.values())
    assert "(incomplete)" not in review.markdown(rd) and "(incomplete)" not in _terminal(rd)
    # A module that is called and has no numbers still makes them incomplete.
    failed = make_run(SPEC, model="tt", version="v3",
                      metrics={"tower.0": {"status": "failed"}, "tower.1": LEAF, "drop": NEVER_CALLED})
    assert not diff_runs(base, failed).totals["forward"]["flops"].complete


def test_peak_memory_gets_no_share_and_a_kind_never_contradicts_its_sign() -> None:
    # tower.0 does more work (FLOPs up, the kind's first metric) yet its own latency drops.
    base, head = _pair({"flops": 300_000, "latency_ms": 0.05, "peak_memory_bytes": 90_000})
    rd = diff_runs(base, head)
    assert rd.get("tower.0").kind == "increased"
    for text in (review.markdown(rd), _terminal(rd)):
        for line in text.splitlines():
            cells = [c.strip() for c in line.replace("│", "|").split("|")]
            if "peak memory" in cells and "`tower.0`" in cells or ("peak memory" in cells and "tower.0" in cells):
                assert cells[-2] == "" or not cells[-2].endswith("%"), line  # no share beside a peak
            for i, cell in enumerate(cells[:-1]):
                if cell in ("increased", "decreased") and cells[i + 1][:1] in "+−-":
                    assert (cell == "increased") == cells[i + 1].startswith("+"), line


@pytest.mark.parametrize("units, word", [
    ([0.01, 0.06, 0.035, 0.02, 0.05, 0.035], "below the 5 % floor"),  # significant, estimate under the floor
    ([0.3, 0.31, 0.29, 0.305, 0.295, 0.3], "regressed"),
    ([0.0, 0.001, -0.001, 0.0005, -0.0005, 0.0], "unchanged"),
])
def test_a_change_inside_the_floor_reads_below_the_floor(units: list[float], word: str) -> None:
    v = stats.paired(units)
    assert comparison.judgement(v) == word
    assert comparison.judgement(None) == "not judged (single round)"
    if word.startswith("below"):
        assert v.verdict == "inconclusive" and abs(math.log(v.ratio)) < math.log1p(stats.FLOOR)


# --- a live comparison with a planted slowdown: the root's latency says one word everywhere -----------------


PROVIDER = "tests.session_models:mlp"


@pytest.mark.slow
@pytest.mark.serial  # a paired verdict on real timings
def test_compare_on_a_planted_pair_says_one_verdict_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cbsite.archive import read_run, resolve_run
    from cbsite.generator import diffdata, latencydata

    runs = tmp_path / "runs"
    common = ["--runs", str(runs), "--budget", "0.02", "--peak-flops", "1e11", "--peak-bandwidth", "1e10",
              "--no-calibrate", "--threads", "1", "--batches", "1", "--no-step", "--no-progress"]
    code = main(["compare", PROVIDER, PROVIDER, "-H", "repeat=3", "--model", "mlp", "--processes", "3", "--pairs", "4",
                 "--block-time", "0.004", *common])
    terminal = capsys.readouterr().out
    assert code == 0
    base, head = (read_run(resolve_run(s, runs).path) for s in ("mlp@base", "mlp@head"))
    evidence = comparison.evidence_for(runs, base, head, {})
    assert evidence is not None
    words = {ph: comparison.judgement(evidence.verdicts()[("", ph)], evidence.floor) for ph in ("forward", "backward")}
    assert words["forward"] == "regressed"  # the planted 3x work in one of three layers

    assert main(["diff", "mlp@base", "mlp@head", "--runs", str(runs), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert main(["diff", "mlp@base", "mlp@head", "--runs", str(runs), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rd = diff_runs(base, head, match_moved=True)
    judged = latencydata.judge(comparison.find_comparison(runs, base.meta["run_id"], head.meta["run_id"]), base, head, rd)
    site_rows = {r["phase"]: r for r in diffdata.totals_rows(rd, judged) if r["metric"] == "latency_ms"}
    site_summary, _ = diffdata.summary(rd, judged)

    assert data["latency_judgement"] == words
    for ph, word in words.items():
        assert site_rows[ph]["judgement"] == word
        # The root's latency row of each table carries the word: the terminal's and Markdown's totals, the lead table.
        term_row = next(line for line in terminal.splitlines() if line.lstrip("│ ").startswith("latency") and ph in line)
        md_total = next(line for line in md.splitlines() if line.startswith(f"| latency | {ph} |"))
        md_lead = next(line for line in md.splitlines() if line.startswith(f"| `mlp` | {ph} |"))
        for row in (term_row, md_total, md_lead):
            assert word in row and "within noise" not in row, row
            assert not ({"regressed", "improved", "unchanged", "inconclusive"} - set(word.split())) & set(
                row.replace("|", " ").replace("│", " ").split()), row
    for text in (terminal, md, data["summary"], site_summary):
        assert "within noise" not in text
        if all(w in ("regressed", "improved") for w in words.values()):
            assert all(w in text for w in words.values())
