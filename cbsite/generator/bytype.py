"""Time and FLOPs by module type: the run page's "sandwich" view of the icicle (speedscope's, by class not by frame).

Each component counts only its *self* part, so nothing is counted twice: a leaf all of its time and FLOPs, a
measured container only its own time (rundata.own_time: what none of its children covers, where the numbers nest)
and its own FLOPs (its count less its children's, where positive). Summed per phase by `module_type`, sorted by
time, with the number of components and calls behind each sum.
"""

from __future__ import annotations

from typing import Any

from cbsite.generator import rundata

MAX_TYPES = 40  # listed on the page; the rest are counted in one line


def _own_flops(comps: dict[str, Any], phase: str, calls: list[int]) -> list[float | None]:
    """Per component and forward: a leaf's FLOPs, a container's FLOPs less its children's (None where unknown
    or not positive: FLOPs are counts, so a container's surplus is work done in its own forward)."""
    n, parent, flops = len(comps["path"]), comps["parent"], comps[phase]["flops"]
    total = [f * calls[i] if isinstance(f, (int, float)) else None for i, f in enumerate(flops)]
    kids = [0.0] * n
    for i, t in enumerate(total):
        if parent[i] >= 0 and t is not None:
            kids[parent[i]] += t
    out: list[float | None] = []
    for i in range(n):
        t = total[i]
        if comps["is_leaf"][i]:
            out.append(t)
        else:
            out.append(t - kids[i] if t is not None and t - kids[i] > 0 else None)
    return out


def by_type(comps: dict[str, Any]) -> dict[str, Any]:
    """{"phases", "rows": [{type, short, components, calls, <phase>: {latency_ms, share, flops}}], "more": types
    not listed, "covered": phase -> share of the phase's latency the listed and unlisted self times add up to},
    from a run's components.json columns; rows sorted by the first phase's time, then the next phase's."""
    n = len(comps["path"])
    calls = [max(c or 0, 1) for c in comps["call_count"]]
    types = [t or "?" for t in comps["module_type"]]
    groups: dict[str, dict[str, Any]] = {}
    members: dict[str, set[int]] = {}
    covered: dict[str, float | None] = {}
    for phase in comps["phases"]:
        lat = comps[phase]["latency_ms"]
        self_ms = {i: lat[i] * calls[i] for i in range(n) if comps["is_leaf"][i] and isinstance(lat[i], (int, float))}
        self_ms.update(rundata.own_time(comps, phase, calls))
        flops = _own_flops(comps, phase, calls)
        root = lat[0] * calls[0] if n and comps["path"][0] == "" and isinstance(lat[0], (int, float)) else None
        total = root if root else sum(self_ms.values())
        for i in range(n):
            ms, f = self_ms.get(i), flops[i]
            if ms is None and f is None:
                continue
            g = groups.setdefault(types[i], {"type": types[i], "short": types[i].rsplit(".", 1)[-1]})
            members.setdefault(types[i], set()).add(i)
            p = g.setdefault(phase, {"latency_ms": 0.0, "flops": None, "share": None})
            p["latency_ms"] += ms or 0.0
            if f is not None:
                p["flops"] = (p["flops"] or 0.0) + f
            p["share"] = p["latency_ms"] / total if total else None
        covered[phase] = sum(self_ms.values()) / total if total else None
    for t, g in groups.items():
        g["components"] = len(members[t])
        g["calls"] = sum(calls[i] for i in members[t])
    phases = comps["phases"]
    rows = sorted(groups.values(), key=lambda g: (*(-g.get(p, {}).get("latency_ms", 0.0) for p in phases),
                                                  *(-(g.get(p, {}).get("flops") or 0.0) for p in phases), g["type"]))
    return {"phases": phases, "rows": rows[:MAX_TYPES], "more": max(0, len(rows) - MAX_TYPES), "covered": covered}
