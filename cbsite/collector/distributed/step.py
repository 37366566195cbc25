"""The sharded model's whole step, in lockstep: what a training job and a server pay per iteration.

The same two modes as the single-process step (cbsite/collector/step.py, whose loss, optimizer rule and
record format are used here): **train** is `zero_grad`, the DMP model's forward in training mode (DDP
around the dense part, the sharded collections' dists and lookups), the loss, `backward()` (DDP's
gradient all-reduce, the output dists' backward all-to-alls, the fused tables' updates) and the optimizer
step (SGD at lr 0 on the parameters that are not fused); **eval** is the forward under `no_grad`. Every
collective of the step runs on all ranks, so the step is timed with `lockstep.time_statement`.

`batch_size` and `examples_per_s` are the job's: every rank's batch (each rank reads its own) times the
world size, per second of the slowest rank's step.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

from cbsite.collector import step as single
from cbsite.collector.distributed.lockstep import Agreement, time_statement
from cbsite.collector.preprocess import batch_size_of
from cbsite.collector.providers import Inputs as ProvidedInputs
from cbsite.collector.timing.blocks import TimingConfig

Batch = tuple[tuple[Any, ...], dict[str, Any]]


def _statement(mode: str, dmp: nn.Module, batches: Sequence[Batch], cfg: single.StepConfig) -> Callable[[], None]:
    if mode == "train":
        dmp.train()
        params = [p for p in dmp.parameters() if p.requires_grad]
        optimizer = single.OPTIMIZERS[cfg.optimizer](params, lr=cfg.lr) if params else None
        state = {"i": 0}

        def fn() -> None:
            args, kwargs = batches[state["i"] % len(batches)]
            state["i"] += 1
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            single.scalar_loss(dmp(*args, **kwargs)).backward()
            if optimizer is not None:
                optimizer.step()
    else:
        dmp.eval()
        fn = single._eval_fn(dmp, batches)
    return fn


def _mode(agree: Agreement, mode: str, dmp: nn.Module, batches: Sequence[Batch], cfg: single.StepConfig) -> dict[str, Any]:
    fn = _statement(mode, dmp, batches, cfg)
    timing = time_statement(agree, f"the {mode} step", fn, 1, TimingConfig(cfg.min_run_time, cfg.warmup, cfg.num_threads,
                                                                          cfg.device, max_component_s=cfg.max_s))
    return {"status": "measured", "notes": timing.notes, "device_time_ms": None,
            "blocks": [{"round": 0, "seconds": b.seconds_per_call, "calls": b.calls, "start_s": round(b.start_s, 6),
                        "wait_s": b.wait_s, "contended": b.contended} for b in timing.blocks]}


def lockstep_step(agree: Agreement, dmp: nn.Module, batches: Sequence[Batch], cfg: single.StepConfig) -> dict[str, Any]:
    """This rank's run.json `step` record of the sharded model, both modes timed in lockstep."""
    plain = [single._plain(b) for b in batches]
    per_rank = batch_size_of(ProvidedInputs(*batches[0])) if batches else None
    job_batch = per_rank * agree.world if per_rank else None
    record: dict[str, Any] = {
        "optimizer": {"name": single.OPTIMIZERS[cfg.optimizer].__name__, "key": cfg.optimizer, "lr": cfg.lr,
                      "why": single.OPTIMIZER_WHY + "; fused tables update inside backward with torchrec's fused optimizer"},
        "loss": single.LOSS_RULE,
        "batch_size": job_batch,
        "batch_size_per_rank": per_rank,
        "rounds": 1,
        "config": {"min_run_time": cfg.min_run_time, "warmup": cfg.warmup, "device": cfg.device, "num_threads": cfg.num_threads},
        "rule": "the DMP model's step on every rank at once (lockstep); ms = median of uncontended blocks; "
                "examples/s = per-rank batch x world size / seconds per iteration",
    }
    for mode in ("train", "eval"):
        if mode == "train" and not cfg.train:
            record[mode] = {"status": "skipped", "error": "the run collects no backward phase, so no training step"}
            continue
        record[mode] = single.summarise([_mode(agree, mode, dmp, plain, cfg)], job_batch)
    dmp.train()
    return record


def trace_step(agree: Agreement, dmp: nn.Module, batches: Sequence[Batch], cfg: single.StepConfig,
               iterations: int = 3) -> bytes:
    """A gzipped Chrome trace of `iterations` training steps on this rank (torch.profiler), all ranks at once.

    The real step shows what replays cannot: torchrec's own stage labels (its `record_function` spans),
    how the dists overlap the compute, and how long each rank waits for the others.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cbsite.artifacts import relative_paths

    fn = _statement("train", dmp, [single._plain(b) for b in batches], cfg)
    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device.startswith("cuda") else [])
    agree.barrier()
    with profile(activities=activities) as prof:
        for _ in range(iterations):
            fn()
        if cfg.device.startswith("cuda"):
            torch.cuda.synchronize()
    fd, raw = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        text = Path(raw).read_text(encoding="utf-8", errors="surrogateescape")
    finally:
        Path(raw).unlink(missing_ok=True)
    dmp.train()
    return gzip.compress(relative_paths(text).encode("utf-8", "surrogateescape"), compresslevel=6)
