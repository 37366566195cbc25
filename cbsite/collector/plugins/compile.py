"""compile: each component alone, eager against `torch.compile` (default inductor backend).

Per component: `torch._dynamo.explain` on its first captured call gives the graph breaks and their
reasons (a separate Dynamo trace, no code generation); then the component is compiled alone, the
first call of each phase (compilation included) is `compile_time_s`, and the compiled phase is
timed exactly like the eager one (same Timer, budget, inputs) for `compiled_latency_ms` and
`compile_speedup` = eager latency / compiled latency. Dynamo's caches are reset per component, so
one component's compilation never serves another's (the inductor on-disk cache may, as in real use).

Compiling every component of a large model is slow on CPU (seconds each): `max_depth` and
`leaves_only` choose which components are compiled; the others keep null compile columns.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cbsite.collector.measure import time_fn
from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler, RunContext

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CompilePlugin(Profiler):
    name = "compile"
    description = "each component alone under torch.compile: compiled latency, speed-up, graph breaks, compile time"
    options = {
        "mode": Option("default", "torch.compile mode", choices=MODES),
        "backend": Option("inductor", "torch.compile backend"),
        "max_depth": Option(None, "compile only components at this depth or shallower", kind=int),
        "leaves_only": Option(False, "compile only leaf modules"),
    }

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.compiled: dict[str, tuple[torch.nn.Module, dict[str, Any]]] = {}

    def start(self, run: RunContext) -> str | None:
        which = []
        if self.opts["max_depth"] is not None:
            which.append(f"depth <= {self.opts['max_depth']}")
        if self.opts["leaves_only"]:
            which.append("leaves only")
        return f"compiled components: {', '.join(which)}" if which else None

    def _wanted(self, ctx: PhaseContext) -> bool:
        depth_ok = self.opts["max_depth"] is None or ctx.depth <= self.opts["max_depth"]
        return depth_ok and (ctx.is_leaf or not self.opts["leaves_only"])

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.replay is None or ctx.replay_with is None or ctx.result is None or not self._wanted(ctx):
            return None
        if ctx.path not in self.compiled:
            self.compiled.clear()  # one component at a time: free the previous compiled graphs
            torch._dynamo.reset()
            breaks = self._graph_breaks(ctx)
            torch._dynamo.reset()
            mode = None if self.opts["mode"] == "default" else self.opts["mode"]
            self.compiled[ctx.path] = (torch.compile(ctx.module, backend=self.opts["backend"], mode=mode), breaks)
        compiled, breaks = self.compiled[ctx.path]
        started = time.perf_counter()
        fn = ctx.replay_with(compiled)  # for backward this runs the compiled forward to build the graph
        fn()  # first call: compilation (AOTAutograd compiles the backward with a grad-mode forward,
        # so the backward row's compile time is often small: its graph was built for the forward row)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - started
        timing = time_fn(fn, ctx.calls_per_replay, ctx.timing)
        eager = ctx.result.timing.median_ms
        return PluginResult(
            columns={
                "compiled_latency_ms": timing.median_ms,
                "compile_speedup": eager / timing.median_ms if timing.median_ms > 0 else None,
                "compile_time_s": compile_s,
                "graph_breaks": breaks["count"],
                "graph_break_reasons": breaks["reasons"],
            },
            metrics={"compiled_p25_ms": timing.p25_ms, "compiled_p75_ms": timing.p75_ms, "graphs": breaks["graphs"]},
        )

    def _graph_breaks(self, ctx: PhaseContext) -> dict[str, Any]:
        call = ctx.calls[0]
        args, kwargs = call.replay_inputs(with_grad=call.grad_enabled)
        with torch.set_grad_enabled(call.grad_enabled):
            explained = torch._dynamo.explain(ctx.module)(*args, **kwargs)
        reasons = []
        for reason in explained.break_reasons:
            where = ""
            if getattr(reason, "user_stack", None):
                frame = reason.user_stack[-1]
                where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
            text = f"{reason.reason}{where}".strip()
            if text not in reasons:
                reasons.append(text[:500])
        return {"count": explained.graph_break_count, "reasons": reasons, "graphs": explained.graph_count}
