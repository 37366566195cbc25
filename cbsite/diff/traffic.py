"""Communication traffic of sharded runs (torchrun) compared between two runs: data only, no torch, no jinja2.

A sharded run's rows carry `comm_bytes_sent` / `comm_bytes_received` (per call, the slowest rank's row) and the
`collectives` a component issues. `diff_traffic` aligns two runs' communicating components by path within each
phase (as `cbsite.diff.rundiff` does; a sharding type's piece, e.g. `...output_dist.row_wise`, is present on one side
only when the plan changed, while its stage, `...output_dist`, is on both) and gives each one's bytes per
forward (per call x calls; `comm_bytes` = sent + received) on both sides. `cbsite.diff.rundiff.RunDiff.traffic` holds
the result, the gate's `comm_bytes*` rules read it (cbsite/gate.py) and the diff page lists it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from cbsite import format as cfmt
from cbsite.diff.record import display_path

METRICS = ("comm_bytes", "comm_bytes_sent", "comm_bytes_received")
_COLUMNS = ("path", "phase", "order", "call_count", "comm_bytes_sent", "comm_bytes_received", "collectives")


@dataclass(frozen=True)
class TrafficDelta:
    """One communicating component in one phase: bytes per forward on each side (None: absent or no traffic)."""

    phase: str
    path: str
    base: dict[str, int | None]  # metric (METRICS) -> bytes per forward
    head: dict[str, int | None]
    collectives_base: tuple[str, ...]
    collectives_head: tuple[str, ...]

    @property
    def kind(self) -> str:
        b, h = self.base["comm_bytes"], self.head["comm_bytes"]
        return "added" if b is None else "removed" if h is None else "increased" if h > b else \
            "decreased" if h < b else "unchanged"

    def change(self, metric: str = "comm_bytes") -> float | None:
        """head / base - 1; None where a side has no value or the base is 0."""
        b, h = self.base[metric], self.head[metric]
        return h / b - 1 if b and h is not None else None


def _side(rows: pl.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    if not {"comm_bytes_sent", "comm_bytes_received"} <= set(rows.columns):
        return {}
    cols = [c for c in _COLUMNS if c in rows.columns]
    out = {}
    # Only the rows with traffic are read row by row: a run that is not sharded has none (both columns null).
    moving = rows.filter(pl.col("comm_bytes_sent").is_not_null() | pl.col("comm_bytes_received").is_not_null())
    for r in moving.select(cols).sort("order").iter_rows(named=True):
        sent, received = r["comm_bytes_sent"], r["comm_bytes_received"]
        if sent is None and received is None:
            continue
        calls = max(r["call_count"] or 0, 1)
        values = {"comm_bytes_sent": sent * calls if sent is not None else None,
                  "comm_bytes_received": received * calls if received is not None else None}
        values["comm_bytes"] = (sent or 0) * calls + (received or 0) * calls
        out[(r["phase"], r["path"])] = {"values": values, "order": r["order"],
                                        "collectives": tuple(r.get("collectives") or ())}
    return out


def diff_traffic(base_rows: pl.DataFrame, head_rows: pl.DataFrame) -> list[TrafficDelta]:
    """Every component with collective traffic on either side, phase by phase in the head's order (a component
    only the base has after them); [] when neither run is sharded."""
    base, head = _side(base_rows), _side(head_rows)
    if not base and not head:
        return []
    phase_rank = {"forward": 0, "backward": 1}
    keys = sorted(set(base) | set(head), key=lambda k: (phase_rank.get(k[0], 2), k[0], k not in head,
                                                        (head.get(k) or base[k])["order"], k[1]))
    none = dict.fromkeys(METRICS)
    return [TrafficDelta(phase=ph, path=path, base=dict(base[(ph, path)]["values"]) if (ph, path) in base else dict(none),
                         head=dict(head[(ph, path)]["values"]) if (ph, path) in head else dict(none),
                         collectives_base=base[(ph, path)]["collectives"] if (ph, path) in base else (),
                         collectives_head=head[(ph, path)]["collectives"] if (ph, path) in head else ())
            for ph, path in keys]


def rows(deltas: list[TrafficDelta], model: str) -> list[dict[str, Any]]:
    """The diff page's and the PR summary's lines: per component and phase, bytes on each side and the changes
    as text (cbsite.format's), e.g. `output_dist` sent 256 kB -> 512 kB, +100%."""

    def amount(v: int | None) -> str | None:
        return None if v is None else cfmt.amount("bytes_moved", v)

    def change(base: int | None, head: int | None) -> str:
        if base is None and head is None:
            return "n/a"
        if base is None:
            return "new"
        if head is None:
            return "removed"
        return cfmt.change(base, head)

    out = []
    for t in deltas:
        row: dict[str, Any] = {"phase": t.phase, "path": display_path(t.path, model), "kind": t.kind,
                               "collectives_base": list(t.collectives_base), "collectives_head": list(t.collectives_head)}
        for m in METRICS:
            row[m] = {"base": amount(t.base[m]), "head": amount(t.head[m]), "change": change(t.base[m], t.head[m])}
        out.append(row)
    return out
