"""An A/A of one component on a CUDA device: the same statements timed again and again by cbsite's own time_fn,
interleaved, beside how long one call takes to launch on the CPU.

Identical twins in one GPU collection (nanogpt's blocks) differed by up to 2x with tight IQRs each: either the
machine drifts between components or cbsite's timing does. Each statement here is timed --repeat times, in turn
with the others; per statement it prints the medians, their max/min, and the CPU microseconds one call takes to
launch (calls without a sync, which the GPU queues): where launching takes about as long as the kernels, the
latency follows the CPU's speed, not the GPU's.

    python3 benchmarks/gpu_repeat.py --repeat 8        # on a CUDA machine; about 30 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cbsite.collector.timing.blocks import TimingConfig, time_fn


def launch_us(fn, calls: int = 2000) -> float:
    """CPU microseconds per call of `fn` with no sync in between (the GPU queues the work). Where the GPU's work is
    longer, the driver's queue fills and the host waits for it: the figure is then the GPU's time, not the launch's."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.1)
    args = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(8, 512, 768, device=dev, dtype=dt)
    lin = nn.Linear(768, 2304, device=dev, dtype=dt)
    mlp = nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)).to(dev, dt)
    big = nn.Linear(768, 50304, device=dev, dtype=dt)

    def no_grad_linear():
        with torch.no_grad():
            return lin(x)

    statements = {"linear 768->2304, no_grad": no_grad_linear, "linear 768->2304, autograd": lambda: lin(x),
                  "mlp 768->3072->768, autograd": lambda: mlp(x), "linear 768->50304, autograd": lambda: big(x)}
    cfg = TimingConfig(min_run_time=args.budget, device="cuda", num_threads=torch.get_num_threads())
    medians: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(args.repeat):
        for name, fn in statements.items():
            medians[name].append(time_fn(fn, 1, cfg).median_ms)
    for name, fn in statements.items():
        ms = medians[name]
        print(f"{name:32} medians ms {' '.join(f'{m:.4f}' for m in ms)} | max/min {max(ms) / min(ms):.2f} "
              f"| launch {launch_us(fn):.1f} us/call | median {statistics.median(ms) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
