"""What bounds a component's time: compute, memory bandwidth, or overhead (the roofline, read per row).

Core module (no torch, no jinja2); the site labels, colours and plots components with it.

The roofline says a component needs at least `flops / peak FLOP/s` (compute) and `bytes / peak bytes/s`
(memory) seconds. Divided by its measured latency these are exactly its MFU and its bandwidth utilisation,
so the label is read from the row's own ratios:

* **overhead**: the roofline explains less than `OVERHEAD_SHARE` (10 %) of the measured time, i.e.
  max(MFU, bandwidth utilisation) < 0.1: the time goes to kernel launches, dispatch and Python, not to
  arithmetic or memory traffic. On a GPU a component whose device time is under `DEVICE_IDLE` (50 %) of
  its latency is overhead too: the device waits for the host most of the time.
* **compute**: otherwise, when MFU >= bandwidth utilisation (arithmetic intensity at or above the
  device's ridge point, peak FLOP/s / peak bytes/s);
* **memory**: otherwise (below the ridge: bandwidth is the nearer roof).
* **None** (no label) when neither ratio is known: no FLOPs and no bytes, or no latency.

Bytes moved is an estimate (the inputs and outputs of every op, no cache), so "memory" means "bound by the
estimated traffic"; a cache-resident working set can show a bandwidth utilisation above 100 %.

Sharded runs have one more label, **communication**: a component whose row's `kind` is "communication" (it issues
collectives, itself or in its subtree) spends part of its time waiting for the other ranks, which no roofline
describes, so it gets that label and never a roofline bound (`with_kind`). The site's lists, badges, bound mix,
icicle and tables all read the label from here.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

BOUNDS = ("compute", "memory", "overhead")
COMMUNICATION = "communication"  # a sharded run's `kind` of a component that issues collectives
OVERHEAD_SHARE = 0.1
DEVICE_IDLE = 0.5


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def classify(mfu: float | None, bandwidth_util: float | None, latency_ms: float | None = None,
             device_time_ms: float | None = None) -> str | None:
    """The bound label of one row (see the module docstring)."""
    c, m = _num(mfu), _num(bandwidth_util)
    if c is None and m is None:
        return None
    lat, dev = _num(latency_ms), _num(device_time_ms)
    if lat and dev is not None and dev < DEVICE_IDLE * lat:
        return "overhead"
    c, m = c or 0.0, m or 0.0
    if max(c, m) < OVERHEAD_SHARE:
        return "overhead"
    return "compute" if c >= m else "memory"


def classify_columns(mfu: Sequence[Any], bandwidth_util: Sequence[Any], latency_ms: Sequence[Any],
                     device_time_ms: Sequence[Any]) -> list[str | None]:
    """`classify` of every row, computed on whole columns (a site build labels millions of rows); the same labels."""
    cols = _columns(mfu, bandwidth_util, latency_ms, device_time_ms)
    if cols is None:
        return [classify(*row) for row in zip(mfu, bandwidth_util, latency_ms, device_time_ms)]
    c, m, lat, dev = cols
    known_c, known_m = np.isfinite(c), np.isfinite(m)
    c, m = np.where(known_c, c, 0.0), np.where(known_m, m, 0.0)
    idle = np.isfinite(lat) & (lat != 0) & np.isfinite(dev) & (dev < DEVICE_IDLE * lat)
    overhead = idle | (np.maximum(c, m) < OVERHEAD_SHARE)
    labels = np.where(overhead, "overhead", np.where(c >= m, "compute", "memory")).astype(object)
    labels[~(known_c | known_m)] = None
    return labels.tolist()


def above_a_peak(mfu: Sequence[Any], bandwidth_util: Sequence[Any]) -> list[bool]:
    """Per row: is its MFU or its bandwidth utilisation above 1 (a row that beats a peak)?"""
    cols = _columns(mfu, bandwidth_util)
    if cols is None:
        return [any(isinstance(v, (int, float)) and v > 1 for v in pair) for pair in zip(mfu, bandwidth_util)]
    c, m = cols
    return ((c > 1) | (m > 1)).tolist()


_PLAIN = {int, float, type(None)}


def _columns(*columns: Sequence[Any]) -> list[np.ndarray] | None:
    """The columns as float arrays, None as NaN; None where they differ in length or hold anything but ints, floats
    and None (bools, text): the row-wise rules decide those."""
    if len({len(c) for c in columns}) > 1 or any(not set(map(type, c)) <= _PLAIN for c in columns):
        return None
    try:
        return [np.array(c, dtype=float) for c in columns]
    except OverflowError:  # an int past float's range: the row-wise rules say what it is
        return None


def peaks(meta: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The run's peak FLOP/s (for its dtype) and peak bytes/s, as its ratios were computed with."""
    device = d if isinstance(d := meta.get("device"), Mapping) else {}
    flops = device.get("peak_flops")
    peak_flops = _num(flops.get(meta.get("dtype"))) if isinstance(flops, Mapping) else _num(flops)
    return peak_flops, _num(device.get("peak_bandwidth"))


def ridge(meta: Mapping[str, Any]) -> float | None:
    """The device's ridge point in FLOP per byte: where the compute and memory roofs meet."""
    f, b = peaks(meta)
    return f / b if f and b else None


def with_kind(labels: Sequence[str | None], kinds: Sequence[Any]) -> list[str | None]:
    """The labels of a sharded run's rows: "communication" where the row's kind says it communicates, the row's
    own label (a roofline bound, or none) elsewhere."""
    return [COMMUNICATION if k == COMMUNICATION else b for b, k in zip(labels, kinds)]
