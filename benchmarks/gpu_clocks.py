"""How a CUDA device's SM clock follows an idle gap, and what that does to a short timing of one kernel.

A profiler that times components one after another leaves the GPU idle between them (counting passes, profiler
passes and bookkeeping run on the CPU), and NVIDIA's clock governor may lower the clocks in such gaps. This times a bf16
Linear (GPT-2 small's attention projection, 4096 x 768 -> 2304) in blocks of about 5 ms right after idle gaps of
several lengths, reading the SM clock (NVML, torch.cuda.clock_rate) after every block, and prints per gap: the
first blocks' ms and clocks, and the median of the last ones.

    python3 benchmarks/gpu_clocks.py            # on a CUDA machine; about 30 s
"""

from __future__ import annotations

import statistics
import time

import torch


def block_ms(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> None:
    dev = torch.device("cuda")
    lin = torch.nn.Linear(768, 2304, device=dev, dtype=torch.bfloat16)
    x = torch.randn(4096, 768, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        fn = lambda: lin(x)  # noqa: E731
        for _ in range(50):
            fn()
        calls = max(1, int(5.0 / block_ms(fn, 200)))  # about 5 ms per block at full clock
        print(f"calls per block {calls} on {torch.cuda.get_device_properties(0).name}")
        for gap in (0.0, 0.05, 0.2, 0.5, 1.0, 3.0, 0.0):
            time.sleep(gap)
            rows = [(block_ms(fn, calls), torch.cuda.clock_rate()) for _ in range(40)]
            first = " ".join(f"{ms:.4f}@{mhz}" for ms, mhz in rows[:8])
            tail = statistics.median(ms for ms, _ in rows[20:])
            print(f"gap {gap:4.2f} s: first blocks ms@MHz {first} | median of blocks 20-39 {tail:.4f} ms "
                  f"| clock after {rows[-1][1]} MHz")


if __name__ == "__main__":
    main()
