"""cbsite diff / cbsite.review: the PR summary (golden), the gate rules, JSON schema, exit codes, site links.

Regenerate the golden summary after an intended change, then review `git diff tests/golden/`:

    CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_review.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cbsite import gate as cgate
from cbsite import review
from cbsite.archive import list_runs, resolve_run
from cbsite.cli import main
from cbsite.diff.comparison import LatencyEvidence
from cbsite.diff.rundiff import diff_runs
from cbsite.errors import CbsiteError
from tests.helpers.runfactory import make_run, write_archive

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("CBSITE_REGEN_GOLDEN") == "1"

# A small recommendation-like model: v2 widens over_arch.0, adds over_arch.2 and renames dense -> bottom.
BASE_SPEC = {
    "": {
        "sparse": {"sparse.tables": {"sparse.tables.t0": None, "sparse.tables.t1": None}},
        "dense": {"dense.0": None, "dense.1": None},
        "over_arch": {"over_arch.0": None, "over_arch.1": None},
    }
}
HEAD_SPEC = {
    "": {
        "sparse": {"sparse.tables": {"sparse.tables.t0": None, "sparse.tables.t1": None}},
        "bottom": {"bottom.0": None, "bottom.1": None},
        "over_arch": {"over_arch.0": None, "over_arch.1": None, "over_arch.2": None},
    }
}
LEAF = {"flops": 100_000, "latency_ms": 0.1, "bytes_moved": 4_000, "param_bytes": 40_000, "peak_memory_bytes": 50_000}


def _runs(tmp_path: Path, **head_leaves: dict[str, Any]) -> Path:
    """An archive with toy@v1 and toy@v2 (fixed run ids, hence fixed created_at); returns its folder."""
    base_metrics = {p: dict(LEAF) for p in ("sparse.tables.t0", "sparse.tables.t1", "dense.0", "dense.1", "over_arch.0", "over_arch.1")}
    head_metrics = {p.replace("dense", "bottom"): dict(v) for p, v in base_metrics.items()}
    head_metrics["over_arch.0"] = {**LEAF, "flops": 300_000, "latency_ms": 0.25, "param_bytes": 120_000}
    head_metrics["over_arch.2"] = dict(LEAF)
    for path, values in head_leaves.items():
        head_metrics[path] = {**head_metrics.get(path, LEAF), **values}
    root = tmp_path / "runs"
    write_archive(root, [
        make_run(BASE_SPEC, model="toy", version="v1", run_id="20250101T000000Z-00000a", metrics=base_metrics),
        make_run(HEAD_SPEC, model="toy", version="v2", run_id="20250102T000000Z-00000b", metrics=head_metrics),
    ])
    return root


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_markdown_summary_matches_the_golden_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = _runs(tmp_path)
    code, out, _ = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", str(runs), "--format", "markdown",
                        "--fail-on", "flops>+40%", "--fail-on", "over_arch.*:latency>+20%", "--fail-on", "peak_memory>+10%",
                        "--site-url", "https://example.org/models/pr-7")
    assert code == 1
    golden = GOLDEN / "review_summary.md"
    if REGEN:
        golden.write_text(out)
    assert out == golden.read_text(), "regenerate with CBSITE_REGEN_GOLDEN=1 and review the diff"
    # What a reviewer needs is there, independently of the golden file's exact text:
    assert "❌ **Gate failed**: 1 of 3 rules broken: `flops>+40%`." in out
    # Single-round runs: the latency rule is not judged (neither held nor broken) and the comment says how to judge it.
    assert "| `over_arch.*:latency>+20%` | ➖ not judged |" in out and "cbsite collect --rounds N" in out
    assert "`dense` → `bottom`" in out and "`dense.1` → `bottom.1`" in out  # renamed, matched as moved
    assert "- **Added** (1): `over_arch.2` (Linear)" in out
    assert "<details><summary>" in out and "</details>" in out
    assert "[Open the diff page](https://example.org/models/pr-7/diffs/toy/v1/v2/)" in out


# --- gate rules: each form passes and fails where it should ---------------------------------------

def _diff_with(tmp_path: Path, **head_leaves: dict[str, Any]):
    runs = _runs(tmp_path, **head_leaves)
    base, head = (resolve_run(s, runs) for s in ("toy@v1", "toy@v2"))
    from cbsite.archive import read_run

    return diff_runs(read_run(base.path), read_run(head.path), match_moved=True)


def _rounds_evidence(rd: Any, spread: float = 0.01, spreads: dict[str, float] | None = None) -> LatencyEvidence:
    """Latency evidence as two runs collected with 4 rounds each would give it: per component and phase,
    round log medians around the run's latency with a known spread (the same offsets, shuffled)."""
    evidence = LatencyEvidence(kind="rounds", source="4 base rounds, 4 head rounds")
    offsets = [-1.2, -0.4, 0.3, 1.3]
    for c in rd.components:
        b, h = c.base["latency_ms"], c.head["latency_ms"]
        if b and h and c.kind not in ("added", "removed"):
            sd = (spreads or {}).get(c.path, spread)
            evidence.units[(c.path, c.phase)] = ([math.log(b) + sd * o for o in offsets],
                                                 [math.log(h) + sd * o for o in offsets[::-1]])
    return evidence


def _breaks(rd: Any, rule: str, phases: list[str] | None = None, evidence: Any = "rounds") -> list[tuple[str, str | None]]:
    latency = _rounds_evidence(rd) if evidence == "rounds" else evidence
    result = cgate.check(rd, cgate.parse_rules([rule]), phases, latency=latency)
    return [(b.phase, b.path) for b in result.breaches]


@pytest.mark.parametrize(
    "rule, head_leaves, breaks",
    [
        # The fixed head: FLOPs 600k -> 900k (+50%), parameters 240k -> 360k B (+50%), bytes moved
        # 24k -> 28k (+17%), peak memory unchanged (the largest leaf is the same), latency 0.6 -> 0.85 ms.
        ("flops>+40%", {}, True),
        ("flops>+60%", {}, False),
        ("param_bytes>+40%", {}, True),
        ("param_bytes>+60%", {}, False),
        ("bytes_moved>+10%", {}, True),
        ("bytes_moved>+20%", {}, False),
        ("peak_memory>+10%", {}, False),
        ("peak_memory>+10%", {"over_arch.2": {"peak_memory_bytes": 56_000}}, True),  # +12%
        ("peak_memory>+15%", {"over_arch.2": {"peak_memory_bytes": 56_000}}, False),
        ("latency>+10%", {}, True),
        ("latency>+50%", {}, False),
    ],
)
def test_total_rules(tmp_path: Path, rule: str, head_leaves: dict[str, Any], breaks: bool) -> None:
    rd = _diff_with(tmp_path, **head_leaves)
    t = rd.totals["forward"]
    assert (t["flops"].base, t["flops"].head) == (600_000, 900_000)
    assert (t["param_bytes"].base, t["param_bytes"].head) == (240_000, 360_000)
    hits = _breaks(rd, rule)
    assert bool(hits) == breaks and all(path is None for _, path in hits)


def test_total_rule_at_the_limit_holds_and_just_beyond_breaks(tmp_path: Path) -> None:
    rd = _diff_with(tmp_path)
    growth = rd.totals["forward"]["flops"].ratio - 1
    assert not _breaks(rd, f"flops>+{growth * 100:.6f}%")
    assert _breaks(rd, f"flops>+{growth * 100 - 0.01:.6f}%")


def test_glob_rules_name_the_breaking_components(tmp_path: Path) -> None:
    rd = _diff_with(tmp_path)
    # over_arch.0 grew 3x, over_arch.2 is new, over_arch.1 is unchanged; over_arch itself grew too.
    assert set(_breaks(rd, "over_arch.*:flops>+100%", ["forward"])) == {("forward", "over_arch.0"), ("forward", "over_arch.2")}
    assert set(_breaks(rd, "over_arch:flops>+50%", ["forward"])) == {("forward", "over_arch")}
    assert not _breaks(rd, "over_arch:flops>+200%", ["forward"])
    assert not _breaks(rd, "sparse.*:flops>+0%")  # nothing changed there
    assert not _breaks(rd, "bottom.*:param_bytes>+1%")  # moved (dense -> bottom), unchanged
    # A moved component is judged against where it was: widen bottom.1 (was dense.1).
    wider = _diff_with(tmp_path / "w", **{"bottom.1": {"flops": 200_000}})
    hits = cgate.check(wider, cgate.parse_rules(["bottom.*:flops>+50%"]), ["forward"]).breaches
    assert [(b.path, b.base_path, b.base, b.head) for b in hits] == [("bottom.1", "dense.1", 100_000, 200_000)]
    # Every compared phase is judged, parameters once.
    assert {p for p, _ in _breaks(rd, "over_arch.0:flops>+100%")} == {"forward", "backward"}
    assert [p for p, _ in _breaks(rd, "over_arch.0:param_bytes>+100%")] == ["forward"]


def test_latency_rules_are_judged_on_evidence(tmp_path: Path) -> None:
    # over_arch.1 gets 30% slower. With rounds that spread 20 % (log sd) the change is not significant at
    # 1 %: inconclusive, reported, the rule holds. With a 1 % spread it is regressed and the rule breaks.
    rd = _diff_with(tmp_path, **{"over_arch.1": {"latency_ms": 0.13}})
    rules = cgate.parse_rules(["over_arch.1:latency>+10%"])
    noisy = cgate.check(rd, rules, ["forward"], latency=_rounds_evidence(rd, spreads={"over_arch.1": 0.2}))
    assert not noisy.breaches and any("inconclusive" in u for u in noisy.unknown)
    quiet = cgate.check(rd, rules, ["forward"], latency=_rounds_evidence(rd, spread=0.01))
    assert [(b.phase, b.path) for b in quiet.breaches] == [("forward", "over_arch.1")]
    assert quiet.breaches[0].verdict["verdict"] == "regressed" and quiet.breaches[0].verdict["ci_low"] > 1.2
    # The rule's limit is the verdict's floor: +30 % is not regressed beyond +50 %.
    assert not cgate.check(rd, cgate.parse_rules(["over_arch.1:latency>+50%"]), ["forward"],
                            latency=_rounds_evidence(rd, spread=0.01)).breaches
    # Without evidence (single-round runs, no comparison) latency is not judged: neither passed nor failed on noise.
    blind = cgate.check(rd, rules, ["forward"], latency=None)
    assert blind.passed and not blind.breaches and blind.not_judged and "cbsite compare" in blind.not_judged[0]


def test_a_missing_value_is_not_judged_but_reported(tmp_path: Path) -> None:
    rd = _diff_with(tmp_path, **{"over_arch.1": {"status": "failed"}})
    result = cgate.check(rd, cgate.parse_rules(["over_arch.1:latency>+10%"]), ["forward"], latency=_rounds_evidence(rd))
    assert result.passed and result.unknown == ["over_arch.1:latency>+10%: forward 'over_arch.1' (not timed on both sides)"]
    result = cgate.check(rd, cgate.parse_rules(["over_arch.1:flops>+10%"]), ["forward"])
    assert result.passed and result.unknown == ["over_arch.1:flops>+10%: forward 'over_arch.1' (no value in the head run)"]


def test_bad_rules_are_all_reported_at_once() -> None:
    with pytest.raises(CbsiteError) as err:
        cgate.parse_rules(["flops>5", "speed>+5%", "latency>-5%", "over_arch.*:flops>+5%", 3])
    text = str(err.value)
    assert "'flops>5'" in text and "unknown metric 'speed'" in text and "negative" in text and "a rule is a string" in text
    assert "over_arch" not in text.split("in --fail-on:")[1].split(". A rule")[0]  # the good rule is not blamed
    forms = cgate.parse_rules(["flops>+5%", "param_bytes>10%", "peak_memory>+10%", "latency>+10%", "over_arch.*:latency>+20%"])
    assert [(r.metric, r.limit, r.glob) for r in forms] == [
        ("flops", 0.05, None), ("param_bytes", 0.1, None), ("peak_memory_bytes", 0.1, None), ("latency_ms", 0.1, None),
        ("latency_ms", 0.2, "over_arch.*"),
    ]


# --- the CLI: exit codes, configuration, JSON -------------------------------------------------------

def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = str(_runs(tmp_path))
    assert _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs)[0] == 0  # no rules: nothing to fail
    assert _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--fail-on", "flops>+100%")[0] == 0
    code, out, _ = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--fail-on", "over_arch.*:flops>+100%")
    assert code == 1 and "gate failed" in out and "over_arch.0" in out and "over_arch.2" in out
    code, _, err = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--fail-on", "flops>5", "--fail-on", "x>+1%")
    assert code == 2 and "'flops>5'" in err and "'x>+1%'" in err
    code, _, err = _cli(capsys, "diff", "toy@v1", "toy@v9", "--runs", runs)
    assert code == 2 and "no run matches 'toy@v9'" in err
    code, _, err = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--phase", "backward", "--fail-on", "flops>+1%")
    assert code == 1
    # Run ids and run folders name runs as well as model@version does.
    refs = list_runs(runs)
    assert _cli(capsys, "diff", refs[0].run_id, str(refs[1].path), "--runs", runs, "--fail-on", "flops>+100%")[0] == 0


def test_rules_from_pyproject(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    runs = str(_runs(tmp_path))
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.chdir(project / "sub")  # found from the working directory upwards
    (project / "pyproject.toml").write_text('[tool.cbsite.gate]\nfail_on = ["flops>+5%", "over_arch.*:latency>+20%"]\n')
    code, out, _ = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs)
    # Single-round toy runs: the latency rule is not judged, the FLOP rule breaks.
    assert code == 1 and "1 of 2 rules broken: flops>+5%" in out and "over_arch.*:latency>+20%: not judged" in out
    # --fail-on replaces the file's rules.
    assert _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--fail-on", "flops>+100%")[0] == 0
    (project / "pyproject.toml").write_text('[tool.cbsite.gate]\nfail_on = ["flops>5", "speed>+1%"]\nfail = 1\n')
    code, _, err = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs)
    assert code == 2 and "unknown key 'fail'" in err and "'flops>5'" in err and "unknown metric 'speed'" in err
    assert "[tool.cbsite.gate]" in err
    (project / "cbsite.toml").write_text('[gate]\nfail_on = "flops>+5%"\n')  # cbsite.toml wins over pyproject
    code, _, err = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs)
    assert code == 2 and "cbsite.toml [gate]" in err and "fail_on must be a list" in err


def test_json_output_validates_against_the_shipped_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = str(_runs(tmp_path, **{"over_arch.1": {"status": "failed"}}))
    schema = json.loads(review.schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for extra in ([], ["--fail-on", "over_arch.*:flops>+10%", "--site-url", "https://x.org/s/"], ["--no-match-moved", "--phase", "forward"]):
        code, out, _ = _cli(capsys, "diff", "toy@v1", "toy@v2", "--runs", runs, "--format", "json", *extra)
        doc = json.loads(out)
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        assert doc["match_moved"] == ("--no-match-moved" not in extra)
    assert doc["counts"]["forward"]["moved"] == 0 and doc["counts"]["forward"]["added"] > 1
    # The schema is strict enough to catch a broken document.
    doc["components"][0]["kind"] = "grown"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def test_the_schema_ships_as_package_data() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    package = Path(review.__file__).parent  # cbsite/
    shipped = pyproject["tool"]["setuptools"]["package-data"]["cbsite"]
    assert review.schema_path().relative_to(package).as_posix() in shipped
    assert review.schema_path().is_file()


def test_the_diff_page_link_follows_the_generators_scheme(tmp_path: Path) -> None:
    from cbsite.generator import templating
    from cbsite.generator.catalog import load_catalog

    root = tmp_path / "runs"
    spec = {"": {"a": None}}
    write_archive(root, [make_run(spec, model="toy", version=v, run_id=f"2025010{i}T000000Z-00000{i}") for i, v in
                         enumerate(["v1", "v2", "v1b", "v3"], start=1)])
    catalog = load_catalog(root)
    consecutive = {(b.run_id, h.run_id) for b, h in catalog.diff_pairs}
    refs = list_runs(root)
    for base in refs:
        for head in refs:
            if base.run_id == head.run_id:
                continue
            url = review.diff_page_url("https://s.org/pr-1", base, head, root)
            run_b = next(r for r in catalog.runs() if r.run_id == base.run_id)
            run_h = next(r for r in catalog.runs() if r.run_id == head.run_id)
            assert url == "https://s.org/pr-1/" + templating.diff_url(run_b, run_h, (base.run_id, head.run_id) in consecutive)


def test_review_imports_no_torch_and_no_site_library() -> None:
    import subprocess
    import sys

    code = "import sys, cbsite.review; print(sorted(m for m in ('torch', 'jinja2', 'mkdocs', 'altair') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
