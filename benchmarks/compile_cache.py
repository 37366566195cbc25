"""compile_time_s with the compile plugin's two cache settings, collected twice each in one process.

`warm` uses the user's inductor cache (here an empty temporary one for the process), so its second
collection reads cache hits; `cold` compiles every phase in a fresh, empty cache. Model:
Linear(64,128) + GELU + Linear(128,64), batch 32, the root only. Timings are data, not pass/fail.

    .venv/bin/python benchmarks/compile_cache.py
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import torch
from torch import nn

from cbsite.collector import CollectConfig, profile


def main() -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="cbsite-bench-inductor-")
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    base = CollectConfig(min_run_time=0.02, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                         progress=False, num_threads=1, plugins=("compile",))
    print(f"torch {torch.__version__}, inductor cache {os.environ['TORCHINDUCTOR_CACHE_DIR']}")
    for cache in ("warm", "warm", "cold", "cold"):
        cfg = dataclasses.replace(base, plugin_options={"compile": {"max_depth": 0, "cache": cache}})
        run = profile(model, torch.randn(32, 64), config=cfg)
        times = {r["phase"]: round(r["compile_time_s"], 3) for r in run.table().to_dicts() if r["path"] == ""}
        print(f"  cache={cache:<4}  compile_time_s forward {times['forward']:6.3f}  backward {times['backward']:6.3f}")


if __name__ == "__main__":
    main()
