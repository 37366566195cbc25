"""Peak FLOP/s and bandwidth: the denominators of MFU and bandwidth utilisation, and where each came from.

GPU peaks come from a table of dense (not sparsity) datasheet figures and can be overridden. A CPU has
no trustworthy datasheet figure for the cores a process actually gets, so its peaks are calibrated here:
the best of several matmul shapes (one shape alone is beaten by some components) and a large copy.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from typing import Any

import torch
from torch.utils.benchmark import Timer

# Dense peak FLOP/s per dtype and peak memory bandwidth (bytes/s), SXM parts, from vendor datasheets.
# float32 means plain FP32 (no TF32); "tf32" is listed separately for matmuls that use it.
GPU_PEAKS: dict[str, dict[str, Any]] = {
    "V100": {"flops": {"float32": 15.7e12, "float16": 125e12}, "bandwidth": 900e9},
    "A100": {"flops": {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12}, "bandwidth": 2039e9},
    "H100": {"flops": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1978.9e12}, "bandwidth": 3.35e12},
    "H200": {"flops": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1978.9e12}, "bandwidth": 4.8e12},
    "B200": {"flops": {"float32": 80e12, "tf32": 1.1e15, "bfloat16": 2.25e15, "float16": 2.25e15, "float8": 4.5e15}, "bandwidth": 8e12},
}

MATMUL_SHAPES = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 2048), (4096, 256, 1024))
COPY_BYTES = 256 * 2**20


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=None)
def calibrate_cpu(dtype: torch.dtype, num_threads: int, min_run_time: float = 0.2) -> dict[str, Any]:
    """Measure the best matmul FLOP/s over several shapes and the best copy bandwidth, on this process's threads."""
    best_flops, best_shape = 0.0, None
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        t = Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=num_threads)
        rate = 2 * m * k * n / t.blocked_autorange(min_run_time=min_run_time).median
        if rate > best_flops:
            best_flops, best_shape = rate, (m, k, n)
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = Timer("dst.copy_(src)", globals={"src": src, "dst": dst}, num_threads=num_threads)
    bandwidth = 2 * COPY_BYTES / t.blocked_autorange(min_run_time=min_run_time).median  # read + write
    return {
        "flops": best_flops,
        "bandwidth": bandwidth,
        "detail": {
            "matmul_shapes": [list(s) for s in MATMUL_SHAPES],
            "best_matmul_shape": list(best_shape) if best_shape else None,
            "copy_bytes": COPY_BYTES,
            "num_threads": num_threads,
        },
    }


def describe_device(
    device: torch.device,
    dtype: torch.dtype,
    *,
    peak_flops: float | None = None,
    peak_bandwidth: float | None = None,
    calibrate: bool = True,
) -> dict[str, Any]:
    """The `device` entry of run.json: kind, name, count, peaks per dtype, and the source of each peak."""
    dtype_name = str(dtype).replace("torch.", "")
    num_threads = torch.get_num_threads()
    info: dict[str, Any] = {"kind": device.type, "num_threads": num_threads}
    flops = bandwidth = None
    source = {"flops": None, "bandwidth": None}
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        info.update(name=name, count=torch.cuda.device_count())
        entry = next((v for k, v in GPU_PEAKS.items() if k in name.upper()), None)
        if entry:
            flops = entry["flops"].get(dtype_name)
            bandwidth = entry["bandwidth"]
            source = {"flops": "table" if flops else None, "bandwidth": "table"}
            info["peak_flops_table"] = entry["flops"]
    else:
        info.update(name=cpu_name(), count=1, cores=os.cpu_count())
        if calibrate:
            cal = calibrate_cpu(dtype, num_threads)
            flops, bandwidth = cal["flops"], cal["bandwidth"]
            source = {"flops": "calibrated", "bandwidth": "calibrated"}
            info["calibration"] = cal["detail"]
    if peak_flops is not None:
        flops, source["flops"] = float(peak_flops), "given"
    if peak_bandwidth is not None:
        bandwidth, source["bandwidth"] = float(peak_bandwidth), "given"
    try:
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    info.update(
        dtype=dtype_name,
        peak_flops={dtype_name: flops} if flops else {},
        peak_bandwidth=bandwidth,
        peak_source=source,
    )
    return info
