"""One profiled pass per component and phase, shared by the trace and ops plugins.

The pass is separate from the timed measurement and never gives a latency: Kineto adds microseconds
per op. Before it, one untimed replay warms caches (lazy initialisation stays out of the trace).
Inside it, each iteration is one `record_function` span labelled with the component path, so the
trace holds the component's work and nothing else: inputs and, for backward, the forward graph are
prepared before the profiler starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from cbsite.collector.plugins.base import PhaseContext
from cbsite.collector.quiet_profiler import quiet_profiler


@dataclass
class ProfiledPass:
    prof: Any  # torch.profiler.profile, stopped
    iterations: int
    calls_per_iteration: int

    @property
    def calls(self) -> int:
        """Calls of the component inside the profiled region (per-call figures divide by this)."""
        return self.iterations * self.calls_per_iteration


def activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda" and torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def profiled_pass(ctx: PhaseContext, iterations: int) -> ProfiledPass:
    """The component's phase run `iterations` times under Kineto; cached on the context."""
    key = f"kineto:{iterations}"
    if key in ctx.shared:
        return ctx.shared[key]
    if ctx.replay is None:
        raise ValueError(f"{ctx.path!r} {ctx.phase} was not measured; nothing to profile")
    cuda = ctx.device.type == "cuda"
    ctx.replay()  # warm-up, outside the profiler
    if cuda:
        torch.cuda.synchronize()
    with quiet_profiler(profile(activities=activities(ctx.device), record_shapes=False)) as prof:
        for _ in range(iterations):
            with record_function(ctx.label):
                ctx.replay()
        if cuda:
            torch.cuda.synchronize()
    ctx.shared[key] = ProfiledPass(prof, iterations, ctx.calls_per_replay)
    return ctx.shared[key]
