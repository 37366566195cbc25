"""The collector on small real models: FLOPs, tree invariants, fallback, odd forwards, KJT replay."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from cbsite import tree
from cbsite.collector import CollectConfig, profile, profile_model
from cbsite.collector.capture import capture
from tests.helpers.modules import FailsWhenAlone


def rows_of(run, phase):
    return {r["path"]: r for r in run.table(phase).to_dicts()}


def check_tree(run):
    for phase in run.table()["phase"].unique():
        tree.self_check(tree.build_tree(run.table(phase).to_dicts()))


def test_linear_flops_forward_and_backward(fast_config):
    batch, fan_in, fan_out = 8, 64, 32
    model = nn.Sequential(nn.Linear(fan_in, fan_out))
    x = torch.randn(batch, fan_in)
    run = profile(model, x, config=fast_config)
    check_tree(run)
    fwd, bwd = rows_of(run, "forward")["0"], rows_of(run, "backward")["0"]
    assert fwd["flops"] == 2 * batch * fan_in * fan_out
    # The first layer computes no input gradient (its input does not require grad): only dW.
    assert bwd["flops"] == 2 * batch * fan_in * fan_out
    assert fwd["status"] == bwd["status"] == "measured"
    assert fwd["param_bytes"] == (fan_in * fan_out + fan_out) * 4
    assert fwd["latency_p25_ms"] <= fwd["latency_ms"] <= fwd["latency_p75_ms"]
    assert fwd["samples"] >= 1 and fwd["mfu"] is not None and fwd["mfu"] > 0


def test_backward_of_inner_layer_includes_input_gradient(fast_config):
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 8))
    run = profile(model, torch.randn(4, 16), config=fast_config)
    bwd = rows_of(run, "backward")
    # Its input comes from layer 0, so it requires grad: dX and dW.
    assert bwd["1"]["flops"] == 2 * (2 * 4 * 16 * 8)
    assert bwd["0"]["flops"] == 2 * 4 * 16 * 16


class Planted(nn.Module):
    def forward(self, x):
        raise RuntimeError("planted failure")


class WithFailure(nn.Module):
    def __init__(self):
        super().__init__()
        self.good = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.bad = Planted()

    def forward(self, x):
        y = self.block(self.good(x))
        try:
            self.bad(y)  # the full model survives; replaying `bad` alone fails
        except RuntimeError:
            pass
        return y


class UsedTwice(nn.Module):
    """Its input feeds two branches, so backward sums two gradients into one."""

    def forward(self, x):
        return x * 2 + x * 3


def test_peak_memory_is_what_the_allocator_sees(fast_config):
    batch, width = 32, 64
    run = profile(nn.Sequential(nn.Linear(width, width), UsedTwice()), torch.randn(batch, width), config=fast_config)
    fwd, bwd = rows_of(run, "forward"), rows_of(run, "backward")
    act = batch * width * 4
    assert fwd["0"]["peak_memory_bytes"] == act  # addmm's output is the Linear's only allocation
    # UsedTwice forward: x*2, x*3 and their sum live at once (plus scalar constants of a few bytes).
    assert 3 * act <= fwd["1"]["peak_memory_bytes"] < 3 * act + 64
    # Backward: grad*2 and grad*3, then autograd adds the second into the first in place. A
    # TorchDispatchMode (the FLOP census) would turn that into an out-of-place add, a third buffer;
    # the peak must be the real run's.
    assert 2 * act <= bwd["1"]["peak_memory_bytes"] < 3 * act


def test_failing_component_is_recorded_and_parent_estimated(fast_config):
    model = nn.Sequential(FailsWhenAlone(), nn.Linear(8, 8))
    run = profile(model, torch.randn(2, 8), config=fast_config)
    check_tree(run)
    fwd = rows_of(run, "forward")
    assert fwd["0"]["status"] == "estimated" and "only works once" in fwd["0"]["error"]
    assert fwd["0.inner"]["status"] == "measured"
    assert fwd["1"]["status"] == "measured"
    assert fwd["0"]["flops"] == fwd["0.inner"]["flops"] == 2 * 2 * 8 * 8
    assert fwd["0"]["latency_ms"] == pytest.approx(fwd["0.inner"]["latency_ms"])


def test_planted_failing_leaf(fast_config):
    run = profile(WithFailure(), torch.randn(2, 8), config=fast_config)
    fwd = rows_of(run, "forward")
    assert fwd["bad"]["status"] == "failed" and "planted failure" in fwd["bad"]["error"]
    assert fwd["good"]["status"] == fwd["block"]["status"] == "measured"
    assert fwd[""]["status"] == "measured"  # the root itself ran (it catches the error)
    # The counts follow the rows; the failed measurements are bad's forward and its backward.
    assert run.meta["counts"]["failed"] == 1 and run.meta["failed_measurements"] == 2


def test_failure_beyond_max_depth_falls_back_to_children(fast_config):
    model = nn.Sequential(FailsWhenAlone(), nn.Linear(8, 8))
    cfg = dataclasses.replace(fast_config, max_depth=1)
    fwd = rows_of(profile(model, torch.randn(2, 8), config=cfg), "forward")
    assert "0.inner" in fwd and fwd["0.inner"]["depth"] == 2  # measured although deeper than max depth
    assert fwd["0"]["status"] == "estimated"


class KwargsOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor(2.0))
        self.act = nn.ReLU(inplace=True)

    def forward(self, *, x, mask=None):
        y = self.act(self.proj(x)) * self.scale
        return {"out": y, "mask": mask}


def test_kwargs_only_forward_with_dict_output(fast_config):
    run = profile(KwargsOnly(), x=torch.randn(3, 4), mask=torch.ones(3, dtype=torch.bool), config=fast_config)
    check_tree(run)
    fwd = rows_of(run, "forward")
    assert all(r["status"] == "measured" for r in fwd.values()), {p: r["error"] for p, r in fwd.items()}
    assert fwd[""]["param_bytes"] == (16 + 4 + 1) * 4  # the buffer counts as static size
    assert any("in-place" in n for n in fwd["act"]["notes"])
    assert rows_of(run, "backward")[""]["status"] == "measured"


class SharedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.alias = self.shared  # the same module under a second name
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x):
        x = self.alias(self.shared(x))
        for block in self.blocks:
            x = block(x)
        return x


def test_shared_module_once_with_call_count_and_uncallable_container(fast_config):
    model = SharedTwice()
    run = profile(model, torch.randn(2, 4), config=fast_config)
    check_tree(run)
    fwd = rows_of(run, "forward")
    assert "alias" not in fwd and fwd["shared"]["call_count"] == 2
    assert fwd["shared"]["flops"] == 2 * 2 * 4 * 4  # per call
    assert fwd["blocks"]["status"] == "estimated" and fwd["blocks"]["call_count"] == 0
    assert fwd["blocks"]["flops"] == fwd["blocks.0"]["flops"] + fwd["blocks.1"]["flops"]
    for path in fwd:
        assert model.get_submodule(path) is not None


def test_every_path_resolves_and_tree_is_consistent(fast_config):
    model = WithFailure()
    run = profile(model, torch.randn(2, 8), config=fast_config)
    check_tree(run)
    for r in run.table().to_dicts():
        model.get_submodule(r["path"])
        assert r["run_id"] == run.run_id and r["model"] == "model"


def test_include_exclude_and_max_depth(fast_config):
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))
    cfg = dataclasses.replace(fast_config, exclude=("*ReLU",), max_depth=1)
    fwd = rows_of(profile(model, torch.randn(2, 4), config=cfg), "forward")
    assert set(fwd) == {"", "0", "1"}
    cfg = dataclasses.replace(fast_config, exclude=("ReLU",))
    fwd = rows_of(profile(model, torch.randn(2, 4), config=cfg), "forward")
    assert fwd["0.1"]["status"] == "skipped" and "exclude" in fwd["0.1"]["error"]


def test_hooks_removed_even_on_error():
    model = nn.Sequential(nn.Linear(2, 2), Planted())
    with pytest.raises(RuntimeError):
        capture(model, (torch.randn(1, 2),), {}, grad=True)
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_keyed_jagged_tensor_capture_and_replay_match_full_model(fast_config):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=50, feature_names=[f"f{i}"]) for i in range(2)]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.randint(0, 50, (9,)), lengths=torch.tensor([1, 2, 3, 1, 0, 2])
    )
    model = nn.ModuleDict({"ebc": ebc})

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.sparse = model

        def forward(self, features):
            return self.sparse["ebc"](features).values()

    wrapper = Wrapper()
    cap = capture(wrapper, (kjt,), {}, grad=True, keep_output=True)
    full = cap.output
    for path in ("sparse.ebc", "sparse.ebc.embedding_bags.t0"):
        call = cap.calls[path][0]
        args, kwargs = call.replay_inputs(with_grad=False)
        replayed = wrapper.get_submodule(path)(*args, **kwargs)
        if path == "sparse.ebc":
            assert torch.equal(replayed.values(), full)
    run = profile(wrapper, kjt, config=fast_config)
    check_tree(run)
    fwd = rows_of(run, "forward")
    bag = fwd["sparse.ebc.embedding_bags.t0"]
    assert bag["status"] == "measured" and bag["flops"] == 6 * 8  # lengths 1+2+3 of f0 pooled, dim 8
    assert "KJT" in fwd["sparse.ebc"]["input_shapes"]
    bwd = rows_of(run, "backward")["sparse.ebc.embedding_bags.t0"]
    assert any("dense embedding gradient" in n for n in bwd["notes"])


def test_batches_rotate(fast_config):
    model = nn.Linear(4, 4)
    batches = [((torch.randn(2, 4),), {}), ((torch.randn(2, 4),), {})]
    run = profile_model(model, batches, fast_config)
    assert run.meta["config"]["batches"] == 2 and run.meta["rotation"]["batches"] == 2


def test_bad_config_reports_every_problem():
    from cbsite.errors import CbsiteError

    with pytest.raises(CbsiteError) as err:
        CollectConfig(phases=("sideways",), dtype="float64", min_run_time=0)
    msg = str(err.value)
    assert "phases" in msg and "dtype" in msg and "budget" in msg


def test_backward_not_applicable_is_skipped_and_is_no_reason_to_go_deeper(fast_config):
    """A parameter-free first block has no backward (nothing requires grad): `skipped`, not a failure,
    and its children stay beyond --max-depth because the block itself was measured."""
    model = nn.Sequential(nn.Sequential(nn.ReLU()), nn.Linear(4, 2))
    run = profile(model, torch.randn(2, 4), config=dataclasses.replace(fast_config, max_depth=1))
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    assert rows[("0", "forward")]["status"] == "measured"
    assert rows[("0", "backward")]["status"] == "skipped"
    assert "backward not applicable" in rows[("0", "backward")]["error"]
    assert ("0.0", "forward") not in rows


def test_the_counting_set_up_is_made_while_the_start_calibration_runs(monkeypatch, fast_config):
    """The first counting pass of a process pays a one-time set-up (counting.warm_up); a collection that would wait for
    its start calibration makes it in that wait, and only then."""
    from cbsite.collector import counting, profiler

    counting.warm_up()  # runs on its own
    called = []
    monkeypatch.setattr(profiler, "warm_counting", lambda: called.append(True))
    model, batches = nn.Linear(4, 4), [((torch.randn(2, 4),), {})]
    monkeypatch.setattr(profiler, "start_calibration_running", lambda: False)
    profiler.profile_model(model, batches, fast_config)
    assert called == []
    monkeypatch.setattr(profiler, "start_calibration_running", lambda: True)
    profiler.profile_model(model, batches, fast_config)
    assert called == [True]
