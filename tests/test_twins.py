"""Identical components counted once (GPT-2's 12 blocks are counted and peak-checked as one): a twin's
FLOPs, bytes and peak memory are exactly those of counting it on its own, and a component whose work depends
on tensor values never lends its counts."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from cbsite.cli import build_parser
from cbsite.collector.capture import Call
from cbsite.collector.config import CollectConfig
from cbsite.collector.profiler import profile_model
from cbsite.collector.providers import provide
from cbsite.collector.timing import blocks
from cbsite.collector.twins import TWIN_SPREAD_RULE, Twins, signature, twin_spread

COUNTED = ["flops", "bytes_moved", "arithmetic_intensity", "peak_memory_bytes", "unsupported_ops", "status", "error"]


def _collect(model: nn.Module, batches: list, once: bool):
    config = CollectConfig(min_run_time=0.005, calibrate=False, step=False, progress=False, count_twins_once=once)
    return profile_model(model, batches, config)


def _rows(run) -> dict[tuple[str, str], dict]:
    return {(r["path"], r["phase"]): r for r in run.rows.to_dicts()}


def _twin_note(row: dict) -> str | None:
    return next((n for n in row["notes"] or [] if "counted on its twin" in n), None)


def test_twins_take_exactly_the_counts_that_counting_each_gives():
    provided = provide("nanogpt", {"size": "tiny"}, batches=2)
    batches = [(i.args, i.kwargs) for i in provided.inputs]
    shared = _rows(_collect(provided.model, batches, once=True))
    each_run = _collect(provide("nanogpt", {"size": "tiny"}, batches=2).model, batches, once=False)
    each = _rows(each_run)
    assert shared.keys() == each.keys()
    for key in each:
        assert {c: shared[key][c] for c in COUNTED} == {c: each[key][c] for c in COUNTED}, key
    # The second block and everything in it take the first's counts, both phases; the first counts for itself.
    assert _twin_note(shared[("blocks.1", "forward")]) and "blocks.0" in _twin_note(shared[("blocks.1", "forward")])
    assert _twin_note(shared[("blocks.1.attn.c_attn", "backward")])
    assert _twin_note(shared[("blocks.0", "forward")]) is None and _twin_note(shared[("", "forward")]) is None
    assert not any(_twin_note(r) for r in each.values())
    assert each_run.meta["twins"]["phases_counted_on_a_twin"] == 0


class Gate(nn.Module):
    """Work decided by a value: the linear layer runs only for inputs that sum above zero."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) if x.sum() > 0 else x * 2


class Masked(nn.Module):
    """Output shape decided by values: a boolean mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[x > 0] * 3).sum()


class TwoOfEach(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Gate(), Gate()
        self.m, self.n = Masked(), Masked()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x.abs() + 1).sum() + self.b(-x.abs() - 1).sum() + self.m(x) + self.n(x - 10)


def test_a_component_whose_work_depends_on_values_counts_for_itself():
    torch.manual_seed(0)
    batches = [((torch.randn(4, 8),), {})]
    rows = _rows(_collect(TwoOfEach(), batches, once=True))
    assert rows[("a", "forward")]["flops"] > 0  # the linear layer ran
    assert rows[("b", "forward")]["flops"] == 0  # it did not: a twin's counts would have said otherwise
    # Same shapes in, different bytes out: the mask kept different elements.
    assert rows[("m", "forward")]["bytes_moved"] != rows[("n", "forward")]["bytes_moved"]
    assert not any(_twin_note(r) for r in rows.values())


def _call(*args, grad: bool = True) -> Call:
    return Call(args=args, kwargs={}, grad_enabled=grad, requires_grad=[True] * len(args))


def test_the_signature_tells_twins_from_look_alikes():
    x = torch.randn(3, 4)
    same = signature(nn.Linear(4, 4), [_call(x)])
    assert same is not None and signature(nn.Linear(4, 4), [_call(torch.randn(3, 4))]) == same
    assert signature(nn.Linear(4, 5), [_call(x)]) != same  # another size
    assert signature(nn.Linear(4, 4, bias=False), [_call(x)]) != same  # another parameter set
    assert signature(nn.Linear(4, 4), [_call(torch.randn(5, 4))]) != same  # another input shape
    assert signature(nn.Linear(4, 4), [_call(x, grad=False)]) != same  # another grad mode
    assert signature(nn.Linear(4, 4).eval(), [_call(x)]) != same  # another training flag
    assert signature(nn.Linear(4, 4).double(), [_call(x)]) != same  # another dtype
    assert signature(nn.Dropout(0.1), [_call(x)]) != signature(nn.Dropout(0.2), [_call(x)])
    def with_view(n: int) -> nn.Module:  # the same lambda, closed over another size
        m = nn.Identity()
        m.shape = (lambda x: x.view(-1, n))
        return m

    assert signature(with_view(2), [_call(x)]) != signature(with_view(4), [_call(x)])
    assert signature(with_view(2), [_call(x)]) == signature(with_view(2), [_call(x)])
    hooked = nn.Linear(4, 4)
    hooked.register_forward_hook(lambda *a: None)
    assert signature(hooked, [_call(x)]) is None  # a hook may do anything
    assert signature(nn.Linear(4, 4), [_call(x, object())]) is None  # an input not described by value


def test_the_cli_can_count_every_twin():
    args = build_parser().parse_args(["collect", "nanogpt", "--count-every-twin"])
    assert args.count_every_twin
    assert not build_parser().parse_args(["collect", "nanogpt"]).count_every_twin


class Slow(nn.Module):
    """A block whose one call outlasts the budget (a sleep stands for the work), counting its own calls."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seconds = seconds
        self.calls = {"forward": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["forward"] += 1
        time.sleep(self.seconds)
        return self.lin(x)


class Chain(nn.Module):
    """Three Slow twins in a row; counts its own calls, each of which calls every twin once."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Slow(seconds) for _ in range(3))
        self.calls = {"forward": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["forward"] += 1
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.serial  # the warm-up rule reads real call times
def test_a_twin_timed_just_after_a_long_twin_takes_no_warm_up_call(monkeypatch):
    """A twin runs no counting or peak pass. Its warm-up call is skipped where the twin timed just before it ran a
    statement past the budget (the same code on the same shapes); a short one still gets its one call."""
    # A block that waited for a CPU (a busy CI host) stays out of `samples`, and would read as an untimed call here.
    monkeypatch.setattr(blocks, "contended", lambda wait, wall: False)
    budget = 0.02
    for seconds, long in ((0.05, True), (0.0, False)):
        model = Chain(seconds)
        batches = [((torch.randn(2, 4),), {})]
        config = CollectConfig(min_run_time=budget, calibrate=False, step=False, progress=False, phases=("forward",))
        rows = _rows(profile_model(model, batches, config))
        for twin in ("blocks.1", "blocks.2"):
            assert _twin_note(rows[(twin, "forward")]), twin
            # Its own calls (those the chain made for it are the chain's: census, passes, timing) less the timed ones:
            # none for a long twin (no warm-up, and a call past a block needs no sizing runs); for a short one its
            # warm-up call and the runs that size its blocks.
            untimed = model.get_submodule(twin).calls["forward"] - model.calls["forward"] - rows[(twin, "forward")]["samples"]
            assert untimed == 0 if long else untimed >= 1, (seconds, twin, untimed)


class Caching(nn.Module):
    """Keeps a tensor from its first call (a rotary table, say): a pass on fake tensors must not leave one behind."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None or self.table.shape != x.shape:
            self.table = torch.ones_like(x)
        return self.lin(x * self.table)


class Mixed(nn.Module):
    """Conv, BatchNorm (running statistics), a cached tensor and a value-dependent gate in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.cache = Caching()
        self.gate = Gate()
        self.masked = Masked()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.conv(x)).flatten(1)[:, :8]
        return self.masked(self.gate(self.cache(h)))


@pytest.mark.slow
def test_counting_on_shapes_gives_exactly_the_counts_of_a_real_run(monkeypatch):
    """Every row's FLOPs, bytes, unsupported ops and peak are the same whether components are counted on fake
    tensors or on real runs (nanoGPT, dlrm, deepfm, the synthetic DLRM, and a model mixing a conv, BatchNorm, a
    cached tensor, a gate and a masked select); value-dependent components (the gate's branch, the masked select,
    torchrec's lookups) are counted for real, and no fake tensor is left in a module."""
    import cbsite.collector.measure as measure
    import cbsite.collector.pipeline.components as components

    cases = [
        (lambda: provide("nanogpt", {"size": "tiny"}, batches=2), None),
        (lambda: provide("dlrm", {"size": "small"}, batches=2), None),
        (lambda: provide("deepfm", {}, batches=2), None),
        (lambda: provide("dlrm-synthetic", {"size": "tiny"}, batches=2), None),
        (lambda: Mixed(), [((torch.randn(4, 4, 8),), {}), ((torch.randn(4, 4, 8),), {})]),
    ]
    for make, given in cases:
        runs = []
        for on_shapes in (True, False):
            # Every component tried on shapes, not only those whose parent ran past REAL_COUNT_BELOW_S.
            monkeypatch.setattr(components, "REAL_COUNT_BELOW_S", 0.0)
            if not on_shapes:
                monkeypatch.setattr(measure, "count_on_shapes", lambda *args: None)
            torch.manual_seed(0)  # the same weights both ways: the masked select's work depends on values
            made = make()
            model, batches = (made, given) if given is not None else (made.model, [(i.args, i.kwargs) for i in made.inputs])
            runs.append(_collect(model, batches, once=False))
            from torch._subclasses.fake_tensor import FakeTensor

            for module in model.modules():
                assert not any(isinstance(v, FakeTensor) for v in vars(module).values()), type(module)
        shaped, real = (_rows(r) for r in runs)
        assert shaped.keys() == real.keys()
        for key in real:
            assert {c: shaped[key][c] for c in COUNTED} == {c: real[key][c] for c in COUNTED}, key
        assert runs[1].meta["counting"]["on_shapes"] == 0
        assert runs[0].meta["counting"]["on_shapes"] > 0
        monkeypatch.undo()
    # The Mixed model's value-dependent components were counted for real, the rest on shapes.
    assert runs[0].meta["counting"]["real"] >= 4


def test_children_of_a_quick_parent_are_counted_on_a_real_run_with_the_same_counts(monkeypatch):
    """A component whose nearest measured ancestor's statement of a phase ran under REAL_COUNT_BELOW_S is counted on a
    real run straight away: the same counts as on shapes; only the root, which has no ancestor, is still tried on
    shapes (the blocks of nanoGPT's ModuleList, a container never called, take the root's)."""
    import cbsite.collector.pipeline.components as components

    runs = []
    for below in (0.0, 1e9):  # every component tried on shapes; every component under a parent counted for real
        monkeypatch.setattr(components, "REAL_COUNT_BELOW_S", below)
        torch.manual_seed(0)
        made = provide("nanogpt", {"size": "tiny"}, batches=2)
        runs.append(_collect(made.model, [(i.args, i.kwargs) for i in made.inputs], once=False))
    shaped, real = (_rows(r) for r in runs)
    assert shaped.keys() == real.keys()
    for key in real:
        assert {c: shaped[key][c] for c in COUNTED} == {c: real[key][c] for c in COUNTED}, key
    assert runs[0].meta["counting"]["on_shapes"] > 2
    assert runs[1].meta["counting"]["on_shapes"] <= 2  # the root's forward and backward at most


def test_the_census_on_shapes_is_the_census_of_a_real_forward():
    """What the memory plan reads (calls, input, output and saved bytes of every module) is the same from a census on
    fake tensors as from a real forward; a value-dependent model (torchrec's lookups, the Mixed model's gate) gets a real
    census, and a census whose inputs fit the keep is left to the real one, which keeps batch 0's inputs."""
    from cbsite.collector.capture import capture
    from cbsite.collector.pipeline.capture_plan import census_on_shapes

    fields = ("counts", "input_bytes", "output_bytes", "saved_bytes")
    torch.manual_seed(0)
    made = provide("nanogpt", {"size": "tiny"}, batches=1)
    convolutional = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.BatchNorm1d(8), nn.ReLU(), nn.Flatten(), nn.Linear(64, 4))
    for model, args, kwargs in ((made.model.train(), made.inputs[0].args, made.inputs[0].kwargs),
                                (convolutional, (torch.randn(4, 4, 8),), {})):
        shaped = census_on_shapes(model, args, kwargs, True, keep_bytes=0)  # 0: as if batch 0's inputs did not fit
        real = capture(model, args, kwargs, grad=True)
        assert shaped is not None and shaped.on_shapes and not shaped.calls
        for name in fields:
            assert getattr(shaped, name) == getattr(real, name), name
        assert census_on_shapes(model, args, kwargs, True, keep_bytes=2**40) is None  # fits: the real census keeps it
    for name, options in (("dlrm", {"size": "small"}), ("deepfm", {})):
        made = provide(name, options, batches=1)
        assert census_on_shapes(made.model.train(), made.inputs[0].args, made.inputs[0].kwargs, True, keep_bytes=0) is None
    assert census_on_shapes(Mixed(), (torch.randn(4, 4, 8),), {}, True, keep_bytes=0) is None


def test_the_real_census_comes_first_and_stops_where_batch_0_passes_the_keep(monkeypatch):
    """planned_captures: where batch 0's inputs fit the keep, one real forward is the whole census (no pass on fake
    tensors is tried); where they do not, the real census stops at the module whose inputs pass it and the census on
    shapes stands in for the whole forward; where no census on shapes can (a value-dependent op), a real one runs to
    the end keeping nothing. Each census is the one a real forward gives, and capture_forwards counts the real ones."""
    import cbsite.collector.pipeline.capture_plan as capture_plan
    from cbsite.collector.capture import capture

    calls: list[tuple[str, int | None, bool]] = []
    on_shapes = [False]
    real_capture = capture_plan.capture

    def watched(model, args, kwargs, **options):
        found = real_capture(model, args, kwargs, **options)
        if not on_shapes[0]:  # the census on shapes captures fake tensors through the same function
            calls.append(("real", options.get("keep_bytes"), found.stopped_early))
        return found

    real_shapes = capture_plan.census_on_shapes

    def shapes_watched(*args, **kwargs):
        on_shapes[0] = True
        try:
            found = real_shapes(*args, **kwargs)
        finally:
            on_shapes[0] = False
        calls.append(("shapes", None, found is None))
        return found

    monkeypatch.setattr(capture_plan, "capture", watched)
    monkeypatch.setattr(capture_plan, "census_on_shapes", shapes_watched)
    torch.manual_seed(0)
    made = provide("nanogpt", {"size": "tiny"}, batches=2)
    model, batches = made.model.train(), [(b.args, b.kwargs) for b in made.inputs]
    truth = capture(model, *batches[0], grad=True)
    fields = ("counts", "input_bytes", "output_bytes", "saved_bytes")

    census, _, captures = capture_plan.planned_captures(model, batches, True, torch.device("cpu"))
    assert [c[0] for c in calls] == ["real"] and census.complete and not census.on_shapes and census.calls
    assert captures.census_forwards == 1
    assert all(getattr(census, f) == getattr(truth, f) for f in fields)

    calls.clear()
    monkeypatch.setattr(capture_plan.memory, "provisional_allowance", lambda model_bytes: 1)  # nothing fits
    census, _, captures = capture_plan.planned_captures(model, batches, True, torch.device("cpu"))
    assert calls == [("real", 1, True), ("shapes", None, False)]
    assert census.on_shapes and not census.complete and captures.census_forwards == 1
    assert all(getattr(census, f) == getattr(truth, f) for f in fields)

    calls.clear()
    gated = Mixed()
    x = torch.randn(4, 4, 8)
    census, _, captures = capture_plan.planned_captures(gated, [((x,), {})], True, torch.device("cpu"))
    assert calls == [("real", 1, True), ("shapes", None, True), ("real", 0, False)]
    assert not census.on_shapes and not census.calls and captures.census_forwards == 2
    full = capture(gated, (x,), {}, grad=True)
    assert all(getattr(census, f) == getattr(full, f) for f in fields)


def _timed_row(path: str, ms: float, spread: float = 0.02) -> dict:
    return {"path": path, "phase": "forward", "status": "measured", "latency_ms": ms,
            "latency_p25_ms": ms * (1 - spread), "latency_p75_ms": ms * (1 + spread)}


def _three_twins() -> Twins:
    twins = Twins()
    counts = type("Counts", (), {"value_dependent": False})()
    twins.offer("sig", "blocks.0", "forward", counts, 0)
    twins.timed("sig", "blocks.1", "forward", 0.0)
    twins.timed("sig", "blocks.2", "forward", 0.0)
    return twins


def test_twins_timed_apart_are_an_aa_and_a_drift_past_half_again_is_a_run_warning():
    """Identical work timed at different moments of one run: its spread is recorded, and a machine that slowed down by
    half again between twins (intervals apart) makes a warning that names both and the factor."""
    steady = [_timed_row("blocks.0", 1.0), _timed_row("blocks.1", 1.1), _timed_row("blocks.2", 1.05)]
    noise, warnings = twin_spread(_three_twins(), steady)
    assert noise["sets"] == 1 and noise["spread_max"] == pytest.approx(1.1) and warnings == []
    drifted = [_timed_row("blocks.0", 1.0), _timed_row("blocks.1", 1.1), _timed_row("blocks.2", 1.8)]
    noise, warnings = twin_spread(_three_twins(), drifted)
    assert noise["worst"] == {"phase": "forward", "slowest": "blocks.2", "fastest": "blocks.0"}
    assert len(warnings) == 1 and "blocks.2 took 1.80x as long as blocks.0" in warnings[0]
    # Intervals that overlap are noise the rows already show: no warning, whatever the medians.
    wide = [_timed_row("blocks.0", 1.0, spread=0.5), _timed_row("blocks.2", 1.8, spread=0.5)]
    assert twin_spread(_three_twins(), wide)[1] == []
    # A failed or estimated member, or a run without twins, records no spread.
    assert twin_spread(_three_twins(), [_timed_row("blocks.0", 1.0)])[0]["sets"] == 0
    assert twin_spread(None, drifted)[0] == {"sets": 0, "spread_median": None, "spread_max": None,
                                            "device_spread_max": None, "worst": None, "rule": TWIN_SPREAD_RULE}
    assert noise["device_spread_max"] is None  # a CPU run has no device times


def test_on_a_gpu_twins_whose_device_times_agree_blame_the_host():
    """The H200's case: latencies of identical blocks 2x apart, their device times within a fraction of a percent."""
    rows = [{**_timed_row("blocks.0", 0.30), "device_time_ms": 0.1723}, {**_timed_row("blocks.1", 0.31), "device_time_ms": 0.1727},
            {**_timed_row("blocks.2", 0.74), "device_time_ms": 0.1728}]
    noise, warnings = twin_spread(_three_twins(), rows)
    assert noise["device_spread_max"] == pytest.approx(0.1728 / 0.1723)
    assert len(warnings) == 1 and "device times differ by at most 1.00x" in warnings[0]
    assert "device_time_ms is the steadier figure" in warnings[0]
    # Device times that differ as much as the latencies: the GPU's work itself differed, no such words.
    rows[2]["device_time_ms"] = 0.40
    assert "device times" not in twin_spread(_three_twins(), rows)[1][0]


def test_a_collection_records_its_twin_sets_as_noise():
    provided = provide("nanogpt", {"size": "tiny"}, batches=2)
    run = _collect(provided.model, [(i.args, i.kwargs) for i in provided.inputs], once=True)
    twins = run.meta["noise"]["twins"]
    # Two blocks: 9 kinds of twin (block, attn, c_attn, attn.c_proj, mlp, c_fc, gelu, mlp.c_proj, and the layer
    # norms: ln_1, ln_2 of both blocks and ln_f are one set) in two phases.
    assert twins["sets"] == 18 and twins["spread_max"] >= 1.0 and twins["spread_median"] >= 1.0
    assert twins["worst"]["slowest"] != twins["worst"]["fastest"]
