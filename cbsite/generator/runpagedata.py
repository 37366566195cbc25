"""Everything one run page reads: the run's tables and key facts (rundata) and, for a sharded run, its per-rank views
(rankdata, which builds on rundata's columns: hence this module above both)."""

from __future__ import annotations

from typing import Any

from cbsite import artifacts, schema
from cbsite.archive import Run
from cbsite.generator import bytype, rankdata, rundata


def run_data(run: Run, warnings: list[str]) -> tuple[rundata.RunData, dict[str, Any], dict[str, Any] | None]:
    assert run.path is not None
    publishable = artifacts.publishable(run.path)
    warnings.extend(f"run {run.run_id}: {p}" for p in publishable[1])
    comps = rundata.components_json(run, warnings, publishable)
    ops = rundata.ops_json(run)
    # A sharded (torchrun) run's rank data and summary (None otherwise), first: its rows' `kind` sets their bound.
    sharded = rankdata.add(run, comps)
    rd = rundata.RunData(
        run=run, totals=rundata.totals(run), top=rundata.hottest(run), phases=comps["phases"], has_ops=ops is not None,
        counts={
            phase: {s: sum(1 for v in comps[phase]["status"] if v == s) for s in schema.STATUSES}
            for phase in comps["phases"]
        },
        facts=rundata.key_facts(comps), paths=comps["path"],
    )
    rd.facts["by_type"] = bytype.by_type(comps)  # the page's time by module type (self time: nothing twice)
    if sharded is not None:
        rd.facts["sharded"] = sharded
    return rd, comps, ops
