"""The whole model's step: one training iteration and one inference forward, timed in blocks.

Beside the per-component replays, a run says what the model costs as a whole, the way a training
loop and a server use it:

* **train**: `optimizer.zero_grad(set_to_none=True)`, the forward in training mode, a scalar loss
  built from the output (the sum of the means of every floating output tensor that requires grad:
  cheap, and it reaches every output), `loss.backward()`, `optimizer.step()`. The optimizer is named
  and recorded in run.json. The default is **SGD with lr 0**: it does the full update arithmetic
  (`param -= lr * grad`, torch's foreach kernel) yet leaves every parameter as it was, so every timed
  iteration does equal work on equal values. Adam and Adagrad (also at lr 0, so parameters stay put;
  their state tensors are created in the warm-up) cost more per step and can be asked for by name.
* **eval**: `model.eval()` and `torch.no_grad()`, the forward only.

Both cycle through the captured batches in order, as the component replays do. Timing is the
collector's own (`measure.time_fn`: warm-up, `block_size` and `timed_block` blocks, blocks that
waited for a CPU kept but left out of the medians, quiet waits): contention is seen here as it is
for every component. The budget is `STEP_BUDGET_FACTOR` times the per-component budget.

With `rounds` > 1 the same measurement is repeated in rounds-1 fresh processes (spawned one after
another, each rebuilding the model from the collect request, or loading a saved copy of a model
handed to the Python API). Then, as for components (session/rounds.py): `ms` is the median of the
rounds' medians of uncontended blocks, `p25_ms`/`p75_ms` are quartiles of the pooled clean blocks,
and the raw blocks of every round are kept in run.json (`step.<train|eval>.blocks`), so a gate can
judge a throughput change round against round (cbsite/throughput.py).

The caller's model is left as it was found (restore.py `preserved`): values, gradients, training
flags, random states. Nothing here changes components.parquet.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from cbsite.collector.capture import moved, tensors_in
from cbsite.collector.config import Batch
from cbsite.collector.preprocess import batch_size_of
from cbsite.collector.providers import Inputs as ProvidedInputs
from cbsite.collector.restore import preserved
from cbsite.collector.timing.blocks import Block, TimingConfig, time_fn
from cbsite.errors import CbsiteError

STEP_BUDGET_FACTOR = 5  # the step is one measurement of the whole model: five component budgets
LOSS_RULE = "sum over the floating output tensors that require grad of their mean"
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adagrad": torch.optim.Adagrad,
}
OPTIMIZER_WHY = ("lr 0: the update arithmetic runs in full but no parameter changes, so every timed iteration "
                 "does equal work on equal values")
MIN_CLEAN_BLOCKS = 3  # a round with fewer uncontended blocks is summarised over all of them (as rounds.py)
WARM_UP_RULE = ("untimed calls before the first block until they have taken the budget (at least one); none in "
                "a collection where the components stage has just run the same work past the budget: the root's "
                "forward and backward for a training step, its forward for an inference forward (the round's "
                "warm_from_components_s); a fresh round's process is always warmed up")


@dataclass(frozen=True)
class StepConfig:
    """How the step is measured; recorded in run.json's `step`."""

    optimizer: str = "sgd"
    lr: float = 0.0
    min_run_time: float = 0.5  # seconds of uncontended timed blocks per mode and round
    warmup: int = 3
    device: str = "cpu"
    num_threads: int = 1
    train: bool = True  # False: the run collects no backward, so no training step either
    max_s: float | None = None  # wall cap per mode and round (None: as measure.TimingConfig)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise CbsiteError(f"step optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr >= 0):
            raise CbsiteError(f"step lr must be a finite number >= 0, got {self.lr!r}")

    def timing(self) -> TimingConfig:
        return TimingConfig(self.min_run_time, self.warmup, self.num_threads, self.device, max_component_s=self.max_s)


class StepNotApplicable(Exception):
    """The model has no training step: nothing requires grad."""


def scalar_loss(output: Any) -> torch.Tensor:
    """The loss of the training step: see LOSS_RULE. Raises StepNotApplicable when nothing requires grad."""
    parts = [t.float().mean() for t in tensors_in(output)
             if t.is_floating_point() and t.requires_grad and t.numel() > 0]
    if not parts:
        raise StepNotApplicable("no floating output requires grad, so there is no loss to differentiate")
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def _plain(batch: Batch) -> Batch:
    """Inputs as data: a tensor that requires grad is detached (a data loader's batch requires none)."""
    return torch.utils._pytree.tree_map(
        lambda x: x.detach() if isinstance(x, torch.Tensor) and x.requires_grad else x, batch
    )


def _train_fn(model: nn.Module, batches: Sequence[Batch], optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    state = {"i": 0}

    def train_step() -> None:
        args, kwargs = batches[state["i"] % len(batches)]
        state["i"] += 1
        optimizer.zero_grad(set_to_none=True)
        loss = scalar_loss(model(*args, **kwargs))
        loss.backward()
        optimizer.step()

    return train_step


def _eval_fn(model: nn.Module, batches: Sequence[Batch]) -> Callable[[], None]:
    state = {"i": 0}

    def eval_forward() -> None:
        args, kwargs = batches[state["i"] % len(batches)]
        state["i"] += 1
        with torch.no_grad():
            model(*args, **kwargs)

    return eval_forward


def _error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"[:2000]


def _block(b: Block, round_: int) -> dict[str, Any]:
    return {"round": round_, "seconds": b.seconds_per_call, "calls": b.calls, "start_s": round(b.start_s, 6),
            "wait_s": b.wait_s, "contended": b.contended}


def measure_round(model: nn.Module, batches: Sequence[Batch], cfg: StepConfig, round_: int = 0,
                  warm: dict[str, float] | None = None, restore: bool = True) -> dict[str, Any]:
    """One round of both modes in this process: {"train"|"eval": {"status", "blocks", "notes", ...}}.

    `warm`: per mode, seconds of the same work this process ran just before (`warm_from_components`); a mode
    warm past its budget takes no warm-up call. With `restore` the model is put back as it was found afterwards
    (parameters, grads, flags, random states); without, the caller puts it back (a collection's own `preserved`).
    """
    warm = warm or {}
    batches = [_plain(b) for b in batches]
    out: dict[str, Any] = {}
    with preserved(model) if restore else contextlib.nullcontext():
        if cfg.train:
            out["train"] = _time_mode("train", model, batches, cfg, round_, warm.get("train"))
        else:
            out["train"] = {"status": "skipped", "error": "the run collects no backward phase, so no training step"}
        out["eval"] = _time_mode("eval", model, batches, cfg, round_, warm.get("eval"))
    return out


def _time_mode(mode: str, model: nn.Module, batches: Sequence[Batch], cfg: StepConfig, round_: int,
               warm_s: float | None = None) -> dict[str, Any]:
    try:
        if mode == "train":
            model.train()
            params = [p for p in model.parameters() if p.requires_grad]
            if not params:
                raise StepNotApplicable("no parameter requires grad, so there is nothing to train")
            optimizer = OPTIMIZERS[cfg.optimizer](params, lr=cfg.lr)
            fn = _train_fn(model, batches, optimizer)
        else:
            model.eval()
            fn = _eval_fn(model, batches)
        # A mode the components stage has just run past the budget needs no warm-up call; otherwise warm-up
        # stops once it has taken the budget.
        warm_s = warm_s if warm_s is not None and warm_s >= cfg.min_run_time else None
        timing = time_fn(fn, 1, cfg.timing(), warm_s=warm_s)
    except StepNotApplicable as exc:
        return {"status": "skipped", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the user's model: recorded, never fatal to the run
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()
        return {"status": "failed", "error": _error_text(exc)}
    return {"status": "measured", "blocks": [_block(b, round_) for b in timing.blocks], "notes": list(timing.notes),
            "device_time_ms": timing.device_time_ms, "warm_up_s": round(timing.warm_up_s, 6),
            "warm_from_components_s": warm_s}


def summarise(mode_rounds: list[dict[str, Any]], batch_size: int | None) -> dict[str, Any]:
    """One mode's record from its rounds: median of round medians, pooled quartiles, examples/s, blocks."""
    measured = [r for r in mode_rounds if r.get("status") == "measured"]
    if not measured:
        first = mode_rounds[0] if mode_rounds else {"status": "skipped", "error": "not measured"}
        return {"status": first.get("status", "failed"), "error": first.get("error"), "rounds": 0}
    blocks = [b for r in measured for b in r["blocks"]]
    medians: list[float] = []
    flagged_rounds: list[int] = []
    used: list[dict[str, Any]] = []
    for r in measured:
        clean = [b for b in r["blocks"] if not b["contended"]]
        flagged = len(clean) < min(MIN_CLEAN_BLOCKS, len(r["blocks"]))
        kept = r["blocks"] if flagged else clean  # a contended round is summarised over all its blocks
        used += kept
        medians.append(statistics.median(b["seconds"] for b in kept))
        if flagged:
            flagged_rounds.append(r["blocks"][0]["round"])
    pooled = sorted(b["seconds"] for b in used)
    median = statistics.median(medians)
    p25, p75 = (statistics.quantiles(pooled, n=4, method="inclusive")[::2] if len(pooled) >= 2 else (pooled[0], pooled[0]))
    notes = [n for r in measured for n in r.get("notes", [])]
    if flagged_rounds:
        notes.append(f"contended in round{'s' * (len(flagged_rounds) > 1)} {', '.join(map(str, flagged_rounds))}: "
                     "too few blocks without waiting for a CPU")
    record: dict[str, Any] = {
        "status": "measured",
        "ms": median * 1e3, "p25_ms": p25 * 1e3, "p75_ms": p75 * 1e3,
        "iterations": sum(b["calls"] for b in used),
        "rounds": len(measured),
        "round_ms": [m * 1e3 for m in medians],
        "contended_blocks": sum(b["contended"] for b in blocks),
        "device_time_ms": measured[0].get("device_time_ms"),
        "examples_per_s": None, "examples_per_s_p25": None, "examples_per_s_p75": None,
        "notes": notes,
        "blocks": blocks,
        # Per round: seconds of untimed warm-up calls, and (the in-process round) the components stage's run of the
        # same work that stood for them (WARM_UP_RULE).
        "warm_up_s": [r.get("warm_up_s") for r in measured],
        "warm_from_components_s": measured[0].get("warm_from_components_s"),
    }
    if batch_size:
        record.update(examples_per_s=batch_size / median, examples_per_s_p25=batch_size / p75,
                      examples_per_s_p75=batch_size / p25)
    if len(medians) >= 2:
        logs = [math.log(m) for m in medians if m > 0]
        record["round_spread"] = statistics.stdev(logs) if len(logs) >= 2 else None
    failed = [r for r in mode_rounds if r.get("status") == "failed"]
    if failed:
        record["notes"].append(f"{len(failed)} round(s) failed: {failed[0].get('error')}")
    return record


def measure_step(
    model: nn.Module,
    batches: Sequence[Batch],
    cfg: StepConfig = StepConfig(),
    *,
    rounds: int = 1,
    rebuild: Any = None,
    warm: dict[str, float] | None = None,
    restore: bool = True,
) -> dict[str, Any]:
    """The run.json `step` record of `model` on `batches` (already on the device, in the run's dtype).

    `rounds` > 1 repeats the measurement in fresh processes; `rebuild` says how a process gets the
    model: a `CollectRequest` (deterministic provider), else the model and batches are saved to a
    temporary file and loaded there. `warm` (measure_round) applies to the in-process round only: a fresh
    process is cold. `restore=False`: the caller puts the model back (it is put back anyway before this
    process's model is saved for fresh rounds).
    """
    batch_size = batch_size_of(ProvidedInputs(*batches[0])) if batches else None
    restore = restore or (rounds > 1 and rebuild is None)
    per_round = [measure_round(model, batches, cfg, 0, warm, restore)]
    extra_error = None
    if rounds > 1:
        try:
            per_round += _fresh_rounds(model, batches, cfg, rounds - 1, rebuild)
        except Exception as exc:  # noqa: BLE001 - the run keeps its in-process round
            extra_error = _error_text(exc)
    record: dict[str, Any] = {
        "optimizer": {"name": OPTIMIZERS[cfg.optimizer].__name__,
                      "key": cfg.optimizer, "lr": cfg.lr, "why": OPTIMIZER_WHY},
        "loss": LOSS_RULE,
        "batch_size": batch_size,
        "rounds": len(per_round),
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("optimizer", "lr")},
        "rule": "ms = median over rounds of each round's median of uncontended blocks; p25/p75 = quartiles of the "
                "pooled clean blocks; examples/s = batch size / seconds per iteration",
        "warm_up": WARM_UP_RULE,
    }
    for mode in ("train", "eval"):
        record[mode] = summarise([r[mode] for r in per_round], batch_size)
    if extra_error:
        record["rounds_error"] = extra_error
    return record


# --- fresh rounds -----------------------------------------------------------------------------------


def _fresh_rounds(model: nn.Module, batches: Sequence[Batch], cfg: StepConfig, count: int, rebuild: Any) -> list[dict[str, Any]]:
    import shutil
    import tempfile

    from cbsite.collector.clean_worker import spawn_pool

    folder = None
    try:
        if rebuild is None:
            folder = tempfile.mkdtemp(prefix="cbsite-step-")
            payload = f"{folder}/payload.pt"
            torch.save({"model": model, "batches": list(batches)}, payload)
            source: dict[str, Any] = {"payload": payload}
        else:
            source = {"request": rebuild}
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        out = []
        for r in range(1, count + 1):
            # One process per round, one at a time: a fresh interpreter samples its own thread placement,
            # allocator state and frequency, which blocks inside one process never see.
            with spawn_pool(1) as pool:  # the worker dies with this process (clean_worker.die_with_parent)
                out.append(pool.submit(_round_worker, source, cfg, r, str(dtype).rsplit(".", 1)[-1]).result())
        return out
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _round_worker(source: dict[str, Any], cfg: StepConfig, round_: int, dtype_name: str) -> dict[str, Any]:
    """A fresh process's round (top level, picklable): rebuild the model and batches, measure both modes."""
    torch.set_num_threads(cfg.num_threads)
    if "payload" in source:
        payload = torch.load(source["payload"], weights_only=False)
        model, batches = payload["model"], payload["batches"]
    else:
        from cbsite.collector.request import prepare

        prepared = prepare(source["request"])
        model, batches = prepared.model, prepared.batches
    device, dtype = torch.device(cfg.device), getattr(torch, dtype_name)
    model = model.to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    batches = [moved(b, device, dtype) for b in batches]
    return measure_round(model, batches, cfg, round_)


def step_config_for(config: Any, num_threads: int) -> StepConfig:
    """The step's configuration from a CollectConfig: its device, warm-up, threads and budget."""
    return StepConfig(
        min_run_time=min(60.0, STEP_BUDGET_FACTOR * config.min_run_time), warmup=config.warmup, device=config.device,
        num_threads=num_threads, train="backward" in config.phases,
        max_s=None if getattr(config, "max_component_s", None) is None else STEP_BUDGET_FACTOR * config.max_component_s,
    )


def warm_from_components(root_seconds: dict[str, float]) -> dict[str, float]:
    """Per mode, how long the components stage ran the same work as one step just before: the root's forward and
    backward (one call each, on the same batches) for a training step, its forward for an inference forward.
    `root_seconds`: phase -> median seconds of one call of the root, as measured."""
    out = {}
    if "forward" in root_seconds:
        out["eval"] = root_seconds["forward"]
        if "backward" in root_seconds:
            out["train"] = root_seconds["forward"] + root_seconds["backward"]
    return out


def collect_step(model: nn.Module, batches: Sequence[Batch], config: Any, num_threads: int, request: Any = None,
                 root_seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """The step stage of `profiler._profile`: the step record for a CollectConfig (rounds as it asks). `root_seconds`:
    the root component's median seconds per call by phase (warm_from_components)."""
    # The collection's own `preserved` puts the caller's model back after the step, the last use of the model (or
    # nothing does, where the model is the collection's own): a second copy of every value (written to a file and read
    # back past 64 MiB) would be untimed work and memory.
    return measure_step(model, batches, step_config_for(config, num_threads), rounds=getattr(config, "rounds", 1),
                        rebuild=request, warm=warm_from_components(root_seconds or {}), restore=False)
