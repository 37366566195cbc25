"""Models and scripts for the memory tests (test_collect_memory.py), run in fresh processes.

Each script prints one JSON line. Peaks are the process's own (ru_maxrss) above its resident memory
just before the work starts, so the interpreter, torch and the built model are not counted: what is
compared is what a plain training step adds against what a collection adds.
"""

from __future__ import annotations

import json
import resource
import sys

import torch
from torch import nn


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Tile(nn.Module):
    """Widens its input 16 times: large activations for little compute."""

    def forward(self, x):
        return x.repeat(1, 16)


class Squash(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5 + x.sigmoid()


class Narrow(nn.Module):
    def forward(self, x):
        return x[:, :256].contiguous()


def wide_model() -> tuple[nn.Module, torch.Tensor]:
    """An embedding table (100 MB of parameters) and element-wise layers on 64 MB activations: a
    footprint of several hundred MB that a 2-core machine computes in milliseconds per layer."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(Tile(), nn.GELU(), Squash(), Narrow()) for _ in range(2)]
    model = nn.Sequential(nn.EmbeddingBag(100_000, 256, mode="sum"), *blocks)
    ids = torch.randint(100_000, (4096, 8))
    return model, ids


def plain_step() -> dict:
    model, ids = wide_model()
    import cbsite.collector.profiler  # noqa: F401 - the same imports as the collection, before the baseline

    base = rss_bytes()
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        model(ids).sum().backward()
    return {"added": peak_bytes() - base}


def collection() -> dict:
    model, ids = wide_model()
    import cbsite.collector.profiler  # noqa: F401 - the collection's imports before the baseline
    from cbsite.collector import CollectConfig, profile

    # The per-component cap bounds the timing (its calls of 64 MB activations, and the waits for a quiet machine beside
    # the rest of the suite); every component is still measured, each call with all its memory.
    config = CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                           progress=False, max_component_s=0.5)
    base = rss_bytes()
    run = profile(model, ids, config=config)
    return {"added": peak_bytes() - base, "statuses": sorted(set(run.table()["status"].to_list())),
            "memory": run.meta["memory"]}


class Pair(nn.Module):
    """Two 128 MB layers: either one's backward fits the limit the test sets, both at once do not."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8192, 4096)
        self.b = nn.Linear(4096, 8192)

    def forward(self, x):
        return self.b(self.a(x))


def over_the_limit() -> dict:
    from collections import OrderedDict

    import cbsite.collector.profiler  # noqa: F401 - the collection's imports before the baseline
    from cbsite.collector import CollectConfig, profile
    from cbsite.collector.memory import data_bytes

    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(pair=Pair()))
    x = torch.randn(4, 8192)
    # Room for one layer's backward (its 128 MB weight gradient, twice while FLOPs are counted) and what
    # the collector itself needs, not for both layers' at once.
    limit = data_bytes() + 272 * 2**20
    config = CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                           progress=False, max_depth=1, step=False, memory_limit=limit, max_component_s=0.5)
    run = profile(model, x, config=config)
    rows = {(r["path"], r["phase"]): {k: r[k] for k in ("status", "error", "latency_ms", "notes")}
            for r in run.table().to_dicts()}
    return {"rows": {f"{p}|{ph}": v for (p, ph), v in rows.items()}, "memory": run.meta["memory"],
            "warnings": run.meta["warnings"], "limit": limit, "weight_ok": bool(torch.isfinite(model.pair.a.weight).all())}


class Churn(nn.Module):
    """Allocates `mib` MiB in 1 MiB pieces per call and frees them all before it returns."""

    def __init__(self, mib: int) -> None:
        super().__init__()
        self.mib = mib

    def forward(self, x):
        pieces = [torch.empty(2**18).fill_(1.0) for _ in range(self.mib)]
        return x * float(len(pieces))


def heap_left_by_a_component() -> dict:
    """glibc kept from giving back what it freed: its mmap threshold above 1 MiB (the pieces come from the heap, as
    tensors below 32 MiB do once larger ones were freed) and its top trim off (as when something live sits above
    the freed pieces). Whatever a measurement of a Churn freed then stays resident unless the collection hands it back."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameters
    assert libc.mallopt(m_mmap_threshold, 64 * 2**20) == 1 and libc.mallopt(m_trim_threshold, 2**30) == 1
    from cbsite.collector import CollectConfig, profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Churn(256), Churn(16))
    config = CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                           progress=False, step=False)
    run = profile(model, torch.randn(4, 8), config=config)
    return {"memory": run.meta["memory"]}


if __name__ == "__main__":
    print(json.dumps({"plain_step": plain_step, "collection": collection, "over_the_limit": over_the_limit,
                      "heap_left_by_a_component": heap_left_by_a_component}[sys.argv[1]](), default=str))
