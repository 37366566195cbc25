"""numerics: a component's forward outputs under two configurations, with dtype-aware tolerances.

The reference is the component as profiled (its run dtype, eager, on the run's device); the other
configuration is one of: `bfloat16` / `float16`, `compiled` (torch.compile, default inductor
backend), `cuda` (a copy on the GPU). Both run under no_grad on every captured call of batch 0.

Lower precision comes in two modes (option `mode`): `cast` (default) runs a copy of the component and
its floating inputs in that dtype, the whole computation in low precision; `autocast` runs the
component as it is under `torch.autocast`, as mixed-precision training and serving do (matmuls in low
precision, reductions and parameters in float32). Models that mix dtypes on purpose need `autocast`:
torchrec's embedding bags return float32 whatever the table dtype, so a cast DLRM feeds float32 into
a bfloat16 Linear and fails; the error says so.

Errors are normwise, relative to the reference output's largest magnitude, so an output that is near
zero in places is not flagged for tiny absolute differences there:

    max_abs_err = max |candidate - reference|
    max_rel_err = max_abs_err / max |reference|
    ok          = max_abs_err <= atol + rtol * max |reference|   (for every floating output)

and integer or boolean outputs must be equal. rtol/atol come from the lower precision of the two
configurations (TOLERANCES); the float32 bound is wider than one rounding because inductor and
other devices reorder reductions. Non-finite values must appear in the same places.
"""

from __future__ import annotations

import copy
from typing import cast

import torch

from cbsite.collector.capture import moved, tensors_in
from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler, RunContext

# (rtol, atol): bfloat16 and float16 take torch.testing's defaults for those dtypes, applied normwise.
TOLERANCES = {
    torch.float32: (1e-4, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
AGAINST = ("bfloat16", "float16", "compiled", "cuda")
PRECISION = {torch.float32: 3, torch.float16: 2, torch.bfloat16: 1}


class NumericsPlugin(Profiler):
    name = "numerics"
    description = "each component's forward outputs against another configuration (bf16, fp16, compiled, CUDA)"
    options = {
        "against": Option("bfloat16", "the other configuration", choices=AGAINST),
        "rtol": Option(None, "relative tolerance (default: by dtype, see TOLERANCES)", kind=float),
        "atol": Option(None, "absolute tolerance (default: by dtype)", kind=float),
        "mode": Option("cast", "bfloat16/float16: cast the component and inputs, or run under torch.autocast",
                       choices=("cast", "autocast")),
    }

    def start(self, run: RunContext) -> str | None:
        self.run = run
        if self.opts["against"] == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("numerics against 'cuda' needs a CUDA device; choose bfloat16, float16 or compiled")
        return None

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.phase != "forward" or ctx.replay is None:
            return None
        against = self.opts["against"]
        low = against in ("bfloat16", "float16")
        autocast = low and self.opts["mode"] == "autocast"
        reference = self._outputs(ctx.module, ctx, ctx.dtype, ctx.device)
        if autocast:
            target = getattr(torch, against)
            with torch.autocast(ctx.device.type, dtype=target):
                candidate = self._outputs(ctx.module, ctx, ctx.dtype, ctx.device)
        else:
            module, target, device = self._candidate(ctx)
            try:
                candidate = self._outputs(module, ctx, target, device)
            except RuntimeError as err:
                if low and "dtype" in str(err):
                    raise RuntimeError(f"{err} (the component mixes dtypes on purpose? "
                                       f"--plugin-option numerics.mode=autocast compares it under torch.autocast)") from err
                raise
        rtol, atol = self._tolerance(ctx.dtype, target)
        abs_err, rel_err, ok = compare(reference, candidate, rtol, atol)
        how = f"{against} autocast" if autocast else against
        return PluginResult(columns={
            "numerics_reference": f"eager {str(ctx.dtype).removeprefix('torch.')} on {ctx.device.type} vs {how} "
                                  f"(rtol {rtol:g}, atol {atol:g})",
            "numerics_max_abs_err": abs_err, "numerics_max_rel_err": rel_err, "numerics_ok": ok,
        })

    def _candidate(self, ctx: PhaseContext) -> tuple[torch.nn.Module, torch.dtype, torch.device]:
        against = self.opts["against"]
        if against in ("bfloat16", "float16"):
            dtype = getattr(torch, against)
            return copy.deepcopy(ctx.module).to(dtype), dtype, ctx.device
        if against == "cuda":
            return copy.deepcopy(ctx.module).to("cuda"), ctx.dtype, torch.device("cuda")
        torch._dynamo.reset()
        # cast: a module compiles to an OptimizedModule, itself an nn.Module (the stubs say a callable).
        return cast(torch.nn.Module, torch.compile(ctx.module)), ctx.dtype, ctx.device

    def _outputs(self, module: torch.nn.Module, ctx: PhaseContext, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
        outs = []
        with torch.no_grad():
            for call in ctx.calls:
                args, kwargs = call.replay_inputs(with_grad=False)
                args, kwargs = moved((args, kwargs), device, dtype)
                outs.extend(tensors_in(module(*args, **kwargs)))
        return outs

    def _tolerance(self, a: torch.dtype, b: torch.dtype) -> tuple[float, float]:
        lower = min((a, b), key=lambda d: PRECISION.get(d, 3))
        rtol, atol = TOLERANCES.get(lower, TOLERANCES[torch.float32])
        return (self.opts["rtol"] if self.opts["rtol"] is not None else rtol,
                self.opts["atol"] if self.opts["atol"] is not None else atol)


def compare(reference: list[torch.Tensor], candidate: list[torch.Tensor], rtol: float, atol: float) -> tuple[float, float, bool]:
    """(max abs error, max normwise relative error, ok) over paired outputs; see the module docstring."""
    if len(reference) != len(candidate):
        raise ValueError(f"the configurations give {len(reference)} and {len(candidate)} output tensors")
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for ref, cand in zip(reference, candidate):
        cand = cand.to(ref.device)
        if ref.shape != cand.shape:
            raise ValueError(f"output shapes differ: {tuple(ref.shape)} and {tuple(cand.shape)}")
        if not ref.is_floating_point():
            same = torch.equal(ref, cand.to(ref.dtype))
            ok &= same
            worst_abs = max(worst_abs, 0.0 if same else float("inf"))
            continue
        r, c = ref.double(), cand.double()
        finite_r, finite_c = torch.isfinite(r), torch.isfinite(c)
        if not torch.equal(finite_r, finite_c):
            ok = False
            worst_abs = worst_rel = float("inf")
            continue
        if r.numel() == 0 or not finite_r.any():
            continue
        diff = (r - c)[finite_r].abs().max().item()
        scale = r[finite_r].abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
        ok &= diff <= atol + rtol * scale
    return worst_abs, worst_rel, bool(ok)
