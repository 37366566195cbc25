"""Step throughput: the whole model's training iteration and eval forward, in runs, `show`, diffs and gates.

Real tiny models; no wall-clock figure is asserted, only relations between recorded numbers.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time

import pytest
import torch
from torch import nn

from cbsite import format as cfmt
from cbsite import gate as cgate
from cbsite import review, throughput
from cbsite.collector.step import StepConfig, measure_step, scalar_loss
from cbsite.errors import CbsiteError
from tests.helpers.runfactory import make_run

FAST = StepConfig(min_run_time=0.01, warmup=1, max_s=2.0)
SPEC = {"": {"a": None, "b": None}}


class Mixed(nn.Module):
    """BatchNorm (running statistics), dropout (RNG) and a second output: what a step could disturb."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.drop(self.bn(self.lin(x)))
        return {"logits": self.head(h), "hidden": h, "ids": torch.argmax(h, dim=1)}


def _batches(n=2, batch=8):
    g = torch.Generator().manual_seed(0)
    return [((torch.randn(batch, 12, generator=g),), {}) for _ in range(n)]


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _check_mode(record, batch):
    assert record["status"] == "measured"
    assert record["blocks"] and all(b["seconds"] > 0 and b["calls"] >= 1 for b in record["blocks"])
    assert record["p25_ms"] <= record["ms"] <= record["p75_ms"]
    # examples/s is the batch over the seconds of one iteration, and its quartiles follow the time's.
    assert record["examples_per_s"] == pytest.approx(batch / (record["ms"] / 1e3), rel=1e-9)
    assert record["examples_per_s_p25"] == pytest.approx(batch / (record["p75_ms"] / 1e3), rel=1e-9)
    assert record["examples_per_s_p25"] <= record["examples_per_s"] <= record["examples_per_s_p75"]
    assert record["iterations"] >= 1 and record["rounds"] == 1


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_step_records_train_and_eval_and_leaves_the_model_as_found(optimizer):
    torch.manual_seed(1)
    model = Mixed().train()
    model.head.weight.grad = torch.ones_like(model.head.weight)  # a gradient the caller had
    before, grad = _state(model), model.head.weight.grad.clone()
    rng = torch.get_rng_state()
    record = measure_step(model, _batches(), StepConfig(optimizer=optimizer, min_run_time=0.01, warmup=1, max_s=2.0))
    assert record["optimizer"]["name"] == {"sgd": "SGD", "adam": "Adam"}[optimizer] and record["optimizer"]["lr"] == 0.0
    assert record["batch_size"] == 8 and record["rounds"] == 1
    for mode in ("train", "eval"):
        _check_mode(record[mode], 8)
    after = _state(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit, BatchNorm's statistics too
    assert torch.equal(model.head.weight.grad, grad) and model.lin.weight.grad is None
    assert model.training and model.bn.training
    assert torch.equal(torch.get_rng_state(), rng)
    json.dumps(record)  # run.json material


def test_lr_zero_makes_every_step_equal_work_on_equal_values():
    """The reason for the default: an optimizer step at lr 0 leaves the parameters where they were."""
    model = nn.Linear(4, 2)
    before = _state(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        scalar_loss(model(torch.randn(5, 4))).backward()
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in _state(model).items())


def test_loss_reaches_every_floating_output_that_requires_grad():
    model = Mixed()
    out = model(torch.randn(4, 12))
    loss = scalar_loss(out)
    loss.backward()
    assert loss.dim() == 0 and model.lin.weight.grad is not None and model.head.weight.grad is not None


def test_frozen_model_has_no_train_step_but_an_eval_forward():
    model = nn.Linear(6, 2).requires_grad_(False)
    record = measure_step(model, [((torch.randn(3, 6),), {})], FAST)
    assert record["train"]["status"] == "skipped" and "nothing to train" in record["train"]["error"]
    _check_mode(record["eval"], 3)


def test_a_failing_forward_is_recorded_not_raised():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            raise RuntimeError("planted")

    record = measure_step(Broken(), [((torch.randn(2, 2),), {})], FAST)
    assert record["train"]["status"] == record["eval"]["status"] == "failed"
    assert "planted" in record["train"]["error"]


def test_bad_optimizer_is_a_user_error():
    with pytest.raises(CbsiteError, match="optimizer"):
        StepConfig(optimizer="lion")


@pytest.mark.slow
def test_rounds_in_fresh_processes_keep_blocks_per_round():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    record = measure_step(model, [((torch.randn(4, 8),), {})], FAST, rounds=2)
    assert "rounds_error" not in record, record.get("rounds_error")
    for mode in ("train", "eval"):
        r = record[mode]
        assert r["rounds"] == 2 and {b["round"] for b in r["blocks"]} == {0, 1}
        assert len(r["round_ms"]) == 2 and r["ms"] == pytest.approx(sorted(r["round_ms"])[0] / 2 + sorted(r["round_ms"])[1] / 2)


@pytest.mark.slow
def test_collect_records_step_in_run_json_and_show_prints_it(tmp_path, capsys):
    from cbsite.archive import list_runs, read_run
    from cbsite.cli import main

    runs = tmp_path / "runs"
    common = ["nanogpt", "-o", "size=tiny", "--max-depth", "1", "--budget", "0.005", "--peak-flops", "1e11",
              "--peak-bandwidth", "1e10", "--no-calibrate", "--no-progress", "--runs", str(runs)]
    assert main(["collect", *common, "--version", "v1"]) == 0
    assert main(["collect", *common, "--version", "v2", "--no-step"]) == 0
    refs = {r.version: r for r in list_runs(runs)}
    run = read_run(refs["v1"].path)
    step = json.loads((refs["v1"].path / "run.json").read_text())["step"]
    assert step == run.meta["step"] and step["optimizer"]["name"] == "SGD"
    batch = run.meta["config"]["batch_size"]
    assert step["batch_size"] == batch
    for mode in ("train", "eval"):
        _check_mode(step[mode], batch)
    assert read_run(refs["v2"].path).meta["step"] is None and read_run(refs["v2"].path).meta["config"]["step"] is False
    capsys.readouterr()
    assert main(["show", "nanogpt@v1", "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "train step:" in out and "eval forward:" in out and "examples" in out and "SGD" in out


# --- diffs and gates (core: synthetic step records) --------------------------------------------------


def _step(ms_per_round: list[float], batch: int = 8, blocks: int = 6, jitter: float = 0.01, seed: int = 0):
    rng = random.Random(seed)
    record = {"optimizer": {"name": "SGD", "lr": 0.0}, "batch_size": batch, "rounds": len(ms_per_round)}
    for mode, scale in (("train", 1.0), ("eval", 0.3)):
        bl = [{"round": r, "seconds": ms * scale / 1e3 * (1 + rng.uniform(-jitter, jitter)), "calls": 4, "wait_s": 0.0,
               "contended": False} for r, ms in enumerate(ms_per_round) for _ in range(blocks)]
        med = sorted(ms_per_round)[len(ms_per_round) // 2] * scale
        record[mode] = {"status": "measured", "ms": med, "p25_ms": med, "p75_ms": med,
                        "examples_per_s": batch / (med / 1e3), "blocks": bl}
    return record


def _runs(base_step, head_step):
    base = make_run(SPEC, model="m", version="v1")
    head = make_run(SPEC, model="m", version="v2")
    base.meta["step"], head.meta["step"] = base_step, head_step
    return base, head


def test_diff_summary_and_json_carry_the_throughput_change():
    from cbsite.diff.rundiff import diff_runs

    base, head = _runs(_step([10.0]), _step([12.5]))
    rd = diff_runs(base, head)
    assert "Step throughput: train" in rd.summary() and "−20%" in rd.summary()
    out = review.to_json(rd, None, match_moved=False)
    assert out["throughput"]["train"]["change"] == pytest.approx(10 / 12.5 - 1)
    assert out["throughput"]["eval"]["base_examples_per_s"] == pytest.approx(8 / 0.003)
    md = review.markdown(rd, None)
    assert "Step throughput" in md
    # Runs without a step record (older runs, --no-step) say nothing about it.
    rd_none = diff_runs(*_runs(None, None))
    assert "Step throughput" not in rd_none.summary() and review.to_json(rd_none, None, match_moved=False)["throughput"] is None


def test_diff_json_with_throughput_breach_follows_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    from cbsite.diff.rundiff import diff_runs

    rd = diff_runs(*_runs(_step([10.0, 10.1, 9.9]), _step([13.0, 13.1, 12.9])))
    gate = cgate.check(rd, cgate.parse_rules(["throughput<-5%"]))
    out = review.to_json(rd, gate, match_moved=False)
    jsonschema.validate(out, json.loads(review.schema_path().read_text()))


@pytest.mark.parametrize(
    ("base_rounds", "head_rounds", "passed", "not_judged"),
    [
        ([10.0, 10.1, 9.9], [13.0, 13.1, 12.9], False, 0),  # a 23 % drop over 3 rounds each: broken
        ([10.0, 10.1, 9.9], [10.05, 9.95, 10.1], True, 0),  # the same throughput: held
        ([10.0], [13.0], True, 2),  # one round each: not judged, whatever the medians say
        ([10.0, 10.1], [13.0], True, 2),  # rounds on one side only: not judged
    ],
)
def test_throughput_rule_judged_only_with_rounds(base_rounds, head_rounds, passed, not_judged):
    from cbsite.diff.rundiff import diff_runs

    rd = diff_runs(*_runs(_step(base_rounds), _step(head_rounds, seed=1)))
    gate = cgate.check(rd, cgate.parse_rules(["throughput<-5%"]))
    assert gate.passed is passed
    assert len(gate.not_judged) == not_judged
    if not passed:
        assert {b.phase for b in gate.breaches} == {"train", "eval"}
        b = gate.breaches[0]
        assert b.change == pytest.approx(10 / 13 - 1, rel=0.02) and b.verdict["verdict"] == "regressed"
        text = "\n".join(review.gate_text(gate, "m"))
        assert "throughput<-5%" in text and "−23%" in text


def test_drop_within_the_limit_holds():
    from cbsite.diff.rundiff import diff_runs

    rd = diff_runs(*_runs(_step([10.0, 10.05, 9.95]), _step([10.3, 10.35, 10.25])))  # about 3 % slower
    gate = cgate.check(rd, cgate.parse_rules(["train_throughput<-10%"]))
    assert gate.passed and not gate.not_judged and len(gate.verdicts) == 1


def test_missing_step_is_unknown_not_a_pass_in_silence():
    from cbsite.diff.rundiff import diff_runs

    rd = diff_runs(*_runs(_step([10.0, 10.0]), None))
    gate = cgate.check(rd, cgate.parse_rules(["eval_throughput<-5%"]))
    assert gate.passed and gate.unknown and "no measured eval step in the head run" in gate.unknown[0]


@pytest.mark.parametrize(
    ("text", "problem"),
    [("throughput<+5%", "drop"), ("thruput<-5%", "unknown metric"), ("throughput<-150%", "less than 100%"),
     ("throughput<5", "METRIC<-N%")],
)
def test_bad_drop_rules_are_refused(text, problem):
    with pytest.raises(CbsiteError, match=problem):
        cgate.parse_rules([text])


def test_show_lines_read_the_record():
    lines = throughput.step_lines({"step": _step([10.0])})
    assert lines[0].startswith("step (whole model, batch 8, optimizer SGD lr 0.0, 1 round)")
    assert "10 ms/iter" in lines[1] and "800 examples/s" in lines[1]
    failed = _step([10.0])
    failed["eval"] = {"status": "failed", "error": "RuntimeError: x"}
    assert "eval forward: failed (RuntimeError: x)" in throughput.step_lines({"step": failed})[2]
    assert throughput.step_lines({"step": None}) == [] and cfmt.examples_rate(math.nan) == "n/a"
    assert copy.deepcopy(failed) == failed


def test_a_step_the_components_stage_has_just_run_past_the_budget_takes_no_warm_up():
    """The root's forward and backward ran the step's work on the same batches just before: where that took the
    budget, the step's warm-up calls are skipped (run.json says so); a fresh or short one is still warmed up."""
    model = Mixed()
    warm = {"train": 1.0, "eval": 1.0}  # seconds, past FAST's budget
    record = measure_step(model, _batches(), FAST, warm=warm)
    for mode in ("train", "eval"):
        assert record[mode]["warm_up_s"] == [0.0] and record[mode]["warm_from_components_s"] == 1.0
    cold = measure_step(model, _batches(), FAST, warm={"train": FAST.min_run_time / 10})
    assert cold["train"]["warm_up_s"][0] > 0 and cold["train"]["warm_from_components_s"] is None
    assert cold["eval"]["warm_up_s"][0] > 0
    assert "none in a collection" in record["warm_up"]


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: the root's backward is then clearly slower than its child's, so no parent/child
    inversion re-times it (a re-timed root's row would no longer be the latency the step was handed)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.02)
        return grad


class Sleepy(nn.Module):
    """A forward that takes past the step's budget (a sleep stands for the work)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 3)

    def forward(self, x):
        time.sleep(0.06)
        return _SlowBackward.apply(self.lin(x))


def test_the_collection_hands_the_roots_timing_to_the_step():
    from cbsite.collector.config import CollectConfig
    from cbsite.collector.profiler import profile_model

    config = CollectConfig(min_run_time=0.01, calibrate=False, progress=False, max_component_s=2.0)
    run = profile_model(Sleepy(), _batches(), config)
    root = {r["phase"]: r["latency_ms"] for r in run.rows.to_dicts() if r["path"] == ""}
    step = run.meta["step"]
    # The step's budget is 5 component budgets (0.05 s): the root's 60 ms forward is past it.
    assert step["train"]["warm_from_components_s"] == pytest.approx((root["forward"] + root["backward"]) / 1e3)
    assert step["eval"]["warm_from_components_s"] == pytest.approx(root["forward"] / 1e3)
    assert step["train"]["warm_up_s"] == [0.0] and step["eval"]["warm_up_s"] == [0.0]
