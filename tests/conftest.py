"""Shared fixtures. Collector tests use a tiny time budget and given peaks, so they are quick and
deterministic in what they assert (never a wall-clock figure)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CBSITE_QUIET", "1")


@pytest.fixture
def fast_config():
    from cbsite.collector import CollectConfig

    return CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10, progress=False)


def pytest_collection_modifyitems(config, items):
    """GPU tests are real code paths, skipped (not deselected) where torch sees no CUDA device."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
