"""ops: the top operators (and CUDA kernels) per component and phase, for ops.parquet.

Figures come from the shared profiled pass (see kineto.py), per call of the component. Every op
event inside the component's labelled span counts with its *self* time (its time minus its
children's), so nested ops are never counted twice and the rows add up to the span:

    sum of op rows' cpu_time_ms  ==  span CPU time  -  span self time

The span's self time is what ran between ops: Python in the module's forward, the autograd engine's
bookkeeping. So the stated agreement is: the op rows never exceed the component's profiled CPU time
(up to rounding) and cover at least COVERAGE_FLOOR of it for a component whose work is in its ops;
`ops.coverage` records the fraction for every row. Ops beyond `top` are summed into one
"(other ops)" row, so the rows always add up. CPU times under the profiler include its overhead
(a few microseconds per op); use them for proportions, and `latency_ms` for time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler
from cbsite.collector.plugins.kineto import profiled_pass

OTHER = "(other ops)"
COVERAGE_FLOOR = 0.8  # documented and tested for op-dominated components (see module docstring)


def _descendants(event: Any) -> Iterator[Any]:
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _flop_key(op: str) -> str:
    """Profiler names read `aten::addmm`; FlopCounterMode keys read `aten.addmm`."""
    return op.replace("::", ".", 1)


class OpsPlugin(Profiler):
    name = "ops"
    description = "top operators (and CUDA kernels) per component and phase, into ops.parquet"
    options = {
        "top": Option(15, "ops kept per component and phase; the rest are summed into one row"),
        "iterations": Option(3, "profiled iterations (shared with the trace plugin when equal)"),
    }

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.replay is None:
            return None
        profiled = profiled_pass(ctx, self.opts["iterations"])
        spans = [e for e in profiled.prof.events() if e.name == ctx.label]
        if not spans:
            raise RuntimeError(f"the profiled pass has no span labelled {ctx.label!r}")
        cpu: dict[str, float] = defaultdict(float)
        device: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        kernels: dict[str, float] = defaultdict(float)
        kernel_calls: dict[str, int] = defaultdict(int)
        span_us = sum(s.cpu_time_total for s in spans)
        for span in spans:
            for event in _descendants(span):
                cpu[event.name] += event.self_cpu_time_total
                device[event.name] += getattr(event, "self_device_time_total", 0.0) or 0.0
                calls[event.name] += 1
                for kernel in getattr(event, "kernels", []) or []:
                    kernels[kernel.name] += kernel.duration
                    kernel_calls[kernel.name] += 1
        per_call = 1e-3 / profiled.calls  # microseconds over all calls -> milliseconds per call
        flops = ctx.result.counts.flops_by_op if ctx.result is not None else {}
        total_cpu = sum(cpu.values())
        rows = self._rows(cpu, device, calls, flops, profiled.calls, per_call, total_cpu, "op")
        if kernels:
            total_dev = sum(kernels.values())
            rows += self._kernel_rows(kernels, kernel_calls, profiled.calls, per_call, total_dev)
        metrics = {
            "profiled_cpu_ms": span_us * per_call,
            "ops_cpu_ms": total_cpu * per_call,
            "coverage": total_cpu / span_us if span_us else 0.0,
        }
        return PluginResult(metrics=metrics, ops=rows)

    def _rows(self, cpu: dict[str, float], device: dict[str, float], calls: dict[str, int], flops: dict[str, int],
              n: int, per_call: float, total: float, kind: str) -> list[dict[str, Any]]:
        ranked = sorted(cpu, key=lambda k: (-cpu[k], k))
        top, rest = ranked[: self.opts["top"]], ranked[self.opts["top"]:]
        rows = [
            {"op": op, "kind": kind, "calls": max(1, round(calls[op] / n)),
             "cpu_time_ms": cpu[op] * per_call, "device_time_ms": (device[op] * per_call) or None,
             "flops": flops.get(_flop_key(op)), "share": cpu[op] / total if total else None}
            for op in top
        ]
        if rest:
            rest_cpu = sum(cpu[k] for k in rest)
            rows.append({"op": f"{OTHER} x{len(rest)}", "kind": kind, "calls": max(1, round(sum(calls[k] for k in rest) / n)),
                         "cpu_time_ms": rest_cpu * per_call, "device_time_ms": None, "flops": None,
                         "share": rest_cpu / total if total else None})
        for rank, row in enumerate(rows, 1):
            row["rank"] = rank
        return rows

    def _kernel_rows(self, kernels: dict[str, float], calls: dict[str, int], n: int, per_call: float,
                     total: float) -> list[dict[str, Any]]:
        ranked = sorted(kernels, key=lambda k: (-kernels[k], k))[: self.opts["top"]]
        return [
            {"op": k, "kind": "kernel", "rank": rank, "calls": max(1, round(calls[k] / n)), "cpu_time_ms": None,
             "device_time_ms": kernels[k] * per_call, "flops": None, "share": kernels[k] / total if total else None}
            for rank, k in enumerate(ranked, 1)
        ]
