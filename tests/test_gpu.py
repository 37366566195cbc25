"""CUDA paths of the collector: device time from CUDA events, peak memory from the caching allocator,
GPU peaks from the datasheet table. Skipped where there is no GPU (see conftest)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cbsite.collector import CollectConfig, profile
from cbsite.collector.device import GPU_PEAKS, describe_device

pytestmark = pytest.mark.gpu


def test_cuda_run_has_device_time_memory_and_table_peaks():
    cfg = CollectConfig(device="cuda", min_run_time=0.01, warmup=1, progress=False)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
    run = profile(model, torch.randn(256, 1024), config=cfg)
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    fwd = rows[("0", "forward")]
    assert fwd["status"] == "measured"
    assert fwd["device_time_ms"] is not None and fwd["device_time_ms"] > 0
    # The output of the first layer alone is 256 x 4096 floats.
    assert fwd["peak_memory_bytes"] >= 256 * 4096 * 4
    assert fwd["flops"] == 2 * 256 * 1024 * 4096
    device = run.meta["device"]
    assert device["kind"] == "cuda"
    if any(k in device["name"].upper() for k in GPU_PEAKS):
        assert device["peak_source"]["flops"] == "table" and device["peak_source"]["bandwidth"] == "table"
        assert 0 < fwd["mfu"] < 1 and 0 < fwd["bandwidth_util"] < 1.5


def test_out_of_memory_component_fails_and_run_goes_on():
    class Hog(nn.Module):
        def forward(self, x):
            if not torch.compiler.is_compiling() and x.shape[0] == 4 and getattr(self, "armed", False):
                return torch.empty(1 << 50, device=x.device)  # far beyond any device
            self.armed = True
            return x * 2

    model = nn.Sequential(Hog(), nn.Linear(8, 8))
    run = profile(model, torch.randn(4, 8), config=CollectConfig(device="cuda", min_run_time=0.01, progress=False))
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    assert rows[("0", "forward")]["status"] == "failed" and "OutOfMemory" in rows[("0", "forward")]["error"]
    assert rows[("1", "forward")]["status"] == "measured"


def test_given_peaks_override_the_table():
    info = describe_device(torch.device("cuda"), torch.bfloat16, peak_flops=1e15, peak_bandwidth=1e12)
    assert info["peak_flops"] == {"bfloat16": 1e15} and info["peak_source"] == {"flops": "given", "bandwidth": "given"}


def test_device_time_leaves_launch_gaps_out_and_a_launch_bound_row_says_so():
    """Twenty tiny element-wise ops take far longer to launch than to run: their device time is the GPU's own work,
    well under the latency, and the row is launch-bound. A large matmul keeps the GPU busy: its device time is its
    latency."""

    class Tiny(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(20):
                x = x + 1
            return x

    cfg = CollectConfig(device="cuda", min_run_time=0.05, progress=False, phases=("forward",), step=False)
    tiny = profile(nn.Sequential(Tiny()), torch.randn(8, 8), config=cfg).table().filter(path="0").to_dicts()[0]
    big = profile(nn.Sequential(nn.Linear(8192, 8192)), torch.randn(8192, 8192), config=cfg).table().filter(
        path="0").to_dicts()[0]
    assert tiny["device_time_ms"] < 0.5 * tiny["latency_ms"], tiny
    assert any(n.startswith("launch-bound") for n in tiny["notes"]), tiny["notes"]
    assert 0.8 < big["device_time_ms"] / big["latency_ms"] < 1.2, big
    assert not any(n.startswith("launch-bound") for n in big["notes"] or [])
