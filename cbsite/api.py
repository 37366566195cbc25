"""The Python API's diff: two runs judged as `cbsite diff` judges them (the CLI's `diff` calls `judge` too), and
`diff_report`, the dict that `cbsite diff --format json` prints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cbsite import review
from cbsite.archive import Run, RunRef, read_run
from cbsite.diff.comparison import LatencyEvidence, evidence_for
from cbsite.diff.rundiff import RunDiff, diff_runs
from cbsite.gate import GateResult, Rule, check, config_rules, parse_rules


@dataclass(frozen=True)
class JudgedDiff:
    """Two runs aligned (`diff`), their latency evidence (a comparison record, else both runs' rounds), the gate's
    result where rules were given, and the one phase asked for (None: every phase both runs have)."""

    diff: RunDiff
    gate: GateResult | None
    evidence: LatencyEvidence | None
    phase: str | None


def gate_rules(fail_on: Sequence[str]) -> list[Rule]:
    """`fail_on` rules, else those of the nearest cbsite.toml / pyproject.toml ([tool.cbsite.gate]), else none."""
    if fail_on:
        return parse_rules(fail_on)
    found = config_rules(Path.cwd())
    return found[0] if found is not None else []


def judge(base: Run, head: Run, runs: str | os.PathLike[str], rules: Sequence[Rule], phase: str | None = None,
          match_moved: bool = True) -> JudgedDiff:
    """Diff `head` against `base`, find the latency evidence in the archive at `runs`, apply the gate `rules`."""
    rd = diff_runs(base, head, match_moved=match_moved)
    main = review.main_phase(rd, phase) if phase else None
    evidence = evidence_for(runs, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    gate = check(rd, rules, [main] if main else None, latency=evidence) if rules else None
    return JudgedDiff(rd, gate, evidence, main)


def diff_report(base: Run | RunRef | str | os.PathLike[str], head: Run | RunRef | str | os.PathLike[str], *,
                runs: str | os.PathLike[str] = "runs", fail_on: Sequence[str] = (), phase: str | None = None,
                match_moved: bool = True) -> dict[str, Any]:
    """`cbsite diff BASE HEAD --format json` as a dict (plain JSON types): the diff, its latency evidence and
    verdicts, throughput and the gate (None without rules). `base`/`head`: Runs, or what `read_run` takes."""
    base_run = base if isinstance(base, Run) else read_run(base, runs=runs)
    head_run = head if isinstance(head, Run) else read_run(head, runs=runs)
    judged = judge(base_run, head_run, runs, gate_rules(fail_on), phase, match_moved)
    out = review.to_json(judged.diff, judged.gate, match_moved=match_moved, latency=judged.evidence)
    return json.loads(json.dumps(out))  # tuples as lists, as the CLI's JSON reads back
