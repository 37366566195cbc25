"""compile: each component alone, eager against `torch.compile` (default inductor backend).

Per component: `torch._dynamo.explain` on its first captured call gives the graph breaks and their
reasons (a separate Dynamo trace, no code generation); then the component is compiled alone, the
first call of each phase (compilation included) is `compile_time_s`, and the compiled phase is
timed exactly like the eager one (same Timer, budget, inputs) for `compiled_latency_ms` and
`compile_speedup` = eager latency / compiled latency. Dynamo's caches are reset per component, so
one component's compilation never serves another's.

`cache` = `cold` (default) compiles each phase in a fresh, empty inductor cache directory
(`torch._inductor.utils.fresh_cache`: FX graph, AOTAutograd and kernel caches start empty and are
deleted after), so `compile_time_s` is a full compilation and the same on a second collection; the
user's own cache is left untouched. `warm` uses the user's cache as real use does: a repeated
collection then reads ~0.1 s where a cold compile takes seconds. Before the first component, a
trivial function is compiled once per process, so inductor's one-time start-up (imports, compiler
checks: ~6 s on CPU here) is not charged to whichever component happens to come first.

Compiling every component of a large model is slow on CPU (seconds each): `max_depth` and
`leaves_only` choose which components are compiled; the others keep null compile columns.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, ContextManager, cast

import torch

from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler, RunContext
from cbsite.collector.timing.blocks import time_fn

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CompilePlugin(Profiler):
    name = "compile"
    description = "each component alone under torch.compile: compiled latency, speed-up, graph breaks, compile time"
    options = {
        "mode": Option("default", "torch.compile mode", choices=MODES),
        "backend": Option("inductor", "torch.compile backend"),
        "max_depth": Option(None, "compile only components at this depth or shallower", kind=int),
        "leaves_only": Option(False, "compile only leaf modules"),
        "cache": Option("cold", "cold: a fresh inductor cache per component and phase; warm: the user's cache",
                        choices=("cold", "warm")),
    }

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.compiled: dict[str, tuple[torch.nn.Module, dict[str, Any]]] = {}

    def start(self, run: RunContext) -> str | None:
        _warm_up_inductor(self.opts["backend"], run.device)
        which = []
        if self.opts["max_depth"] is not None:
            which.append(f"depth <= {self.opts['max_depth']}")
        if self.opts["leaves_only"]:
            which.append("leaves only")
        which.append(f"{self.opts['cache']} inductor cache")
        return f"compiled components: {', '.join(which)}"

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
            # cast: a module compiles to an OptimizedModule, itself an nn.Module (the stubs say a callable).
            compiled_module = cast(torch.nn.Module, torch.compile(ctx.module, backend=self.opts["backend"], mode=mode))
            self.compiled[ctx.path] = (compiled_module, breaks)
        compiled, breaks = self.compiled[ctx.path]
        with _cache(self.opts["cache"]):
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


def _cache(which: str) -> ContextManager[Any]:
    """A fresh, empty inductor cache for the block (cold), or the user's own (warm)."""
    if which == "warm":
        return contextlib.nullcontext()
    from torch._inductor.utils import fresh_cache

    return fresh_cache()


_WARMED: set[tuple[str, str]] = set()


def _warm_up_inductor(backend: str, device: torch.device) -> None:
    """Pay the compiler's one-time process start-up here, not in the first component's compile_time_s."""
    if (backend, device.type) in _WARMED:
        return
    with _cache("cold"):
        torch._dynamo.reset()
        torch.compile(lambda x: (x * 2).sum(), backend=backend)(torch.ones(4, device=device))
        torch._dynamo.reset()
    _WARMED.add((backend, device.type))
