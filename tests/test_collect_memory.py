"""A collection's memory stays near the model's own, and out of memory is a result.

The peaks are measured by the processes themselves (ru_maxrss above their resident memory just before
the work), never by a timing; every figure runs in a fresh process (tests/memory_models.py) so earlier
tests' allocations do not count.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from cbsite.collector import memory, restore
from cbsite.collector.capture import capture, tensors_in
from cbsite.collector.measure import ComponentMeasurement
from cbsite.collector.timing.blocks import TimingConfig, one_call_per_block
from cbsite.collector.timing.graphs import FreshGraphs, GraphCycle, _grad
from cbsite.errors import CbsiteError

HERE = Path(__file__).parent


def _script(name: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "memory_models.py"), name], capture_output=True, text=True,
                          timeout=900, cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_component_past_the_memory_limit_fails_its_children_are_measured_and_it_is_estimated():
    """Both layers' backward together need more than the limit, each alone fits: the CPU allocator's
    refusal under RLIMIT_DATA becomes `failed: out of memory` instead of the kernel's OOM killer."""
    got = _script("over_the_limit")
    rows = got["rows"]
    for parent in ("pair", ""):
        row = rows[f"{parent}|backward"]
        assert row["status"] == "estimated" and row["error"].startswith("out of memory"), row
        assert row["latency_ms"] is not None  # estimated from the children
    for child in ("pair.a", "pair.b"):  # beyond --max-depth 1: measured because their parent fell back
        assert rows[f"{child}|backward"]["status"] == "measured", rows[f"{child}|backward"]
        assert rows[f"{child}|forward"]["status"] == "measured"
    assert rows["pair|forward"]["status"] == "measured"  # the forward fits: only the backward failed
    assert set(got["memory"]["out_of_memory"]) == {"<root> (backward)", "pair (backward)"}
    assert got["memory"]["limit_bytes"] == got["limit"] and got["memory"]["limit_source"].startswith("given")
    assert any("ran out of memory" in w and "pair (backward)" in w for w in got["warnings"])
    assert got["weight_ok"]  # the model is left as found


@pytest.mark.slow
def test_a_collection_holds_at_most_one_and_a_half_times_what_a_plain_step_holds():
    """Peak memory of a collection at most 1.5x that of a plain training step of the
    same model and batch (here a 50 MB table and 64 MB activations: several hundred MB per step)."""
    plain = _script("plain_step")["added"]
    collected = _script("collection")
    assert collected["statuses"] == ["measured"]
    assert plain > 300 * 2**20  # the model, not the interpreter, sets the scale
    assert collected["added"] <= 1.5 * plain, (collected["added"] / 2**20, plain / 2**20, collected["memory"])
    # Which step needed the memory: the last raiser holds the run's peak (before the final stages).
    mem = collected["memory"]
    setter = mem["peak_set_by"]
    # A component's capture or measurement, or, where none raised it, the census's whole-model forward before them.
    assert (setter["what"] in ("capture", "measurement") and setter["path"] in {"", "0", "1", "2"} | {
        f"{b}.{i}" for b in (1, 2) for i in range(4)}) or (
        setter["what"] == "stage" and setter["stage"] in ("preserve_model", "setup_and_capture", "calibration_start")), setter
    assert setter["peak_bytes"] <= mem["peak_rss_bytes"]
    raised = [r["raised_bytes"] for r in mem["peak_raised_most_by"]]
    assert raised == sorted(raised, reverse=True) and all(r > 0 for r in raised) and len(raised) <= 5


def test_capture_keeps_only_the_paths_asked_for_and_counts_every_module():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    cap = capture(model, (x,), {}, grad=True, paths=["2"])
    assert set(cap.calls) == {"2"} and cap.output is None
    assert {p: cap.call_count(p) for p in ("", "0", "1", "2")} == {"": 1, "0": 1, "1": 1, "2": 1}
    assert cap.input_bytes["0"] == 3 * 4 * 4 and cap.input_bytes["2"] == 3 * 8 * 4
    # The graph saves the ReLU's output and the first Linear's input, never the weights (the model's own).
    assert 0 < cap.saved_bytes[""] < 3 * (4 + 8 + 8) * 4 + 64
    assert "0" in cap.saved_bytes


def test_a_group_capture_stops_the_forward_once_its_modules_have_made_their_calls():
    """A capture of early modules does not run the rest of the model (at GPT-2 size the capture forwards
    were 239 s of an 8 x 512 collection); what it keeps equals a full capture's."""
    ran: list[str] = []

    class Tail(nn.Module):
        def forward(self, x):
            ran.append("tail")
            return x * 2

    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared, Tail())  # `shared` is called twice per forward
    x = torch.randn(3, 4)
    full = capture(model, (x,), {}, grad=True, paths=["0", "1"])
    assert ran == ["tail"] and full.call_count("0") == 2
    early = capture(model, (x,), {}, grad=True, paths=["0", "1"], stop_after={"0": 2, "1": 1}, census=False)
    assert ran == ["tail"]  # the tail never ran: the forward stopped after the second call of `shared`
    assert [len(early.calls[p]) for p in ("0", "1")] == [2, 1]
    for p in ("0", "1"):
        for a, b in zip(full.calls[p], early.calls[p]):
            assert torch.equal(a.args[0], b.args[0])
    # A count the forward never reaches: the whole forward runs.
    capture(model, (x,), {}, grad=True, paths=["0"], stop_after={"0": 3})
    assert ran == ["tail", "tail"]

    class Careful(nn.Module):  # a model whose own fallback catches Exception does not swallow the stop
        def __init__(self):
            super().__init__()
            self.inner, self.tail = nn.Linear(4, 4), Tail()

        def forward(self, x):
            try:
                x = self.inner(x)
            except Exception:  # noqa: BLE001
                x = x + 1
            return self.tail(x)

    capture(Careful(), (x,), {}, grad=True, paths=["inner"], stop_after={"inner": 1})
    assert ran == ["tail", "tail"]


def test_a_tensor_several_modules_receive_is_cloned_once():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) + self.b(x)

    cap = capture(Twice(), (torch.randn(2, 4),), {}, grad=False)
    assert cap.calls["a"][0].args[0] is cap.calls["b"][0].args[0]  # one clone for both
    assert cap.calls[""][0].args[0] is cap.calls["a"][0].args[0]


def test_a_capped_capture_is_a_census_only():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    cap = capture(model, (torch.randn(32, 64),), {}, grad=True, keep_bytes=10_000)
    assert not cap.complete and cap.calls == {} and cap.call_count("1") == 1


def test_a_graph_is_freed_as_soon_as_it_is_let_go_without_the_garbage_collector():
    """A recursive closure in tensors_in once held every graph until the next gc run (600 MB at the test
    model's size); references must be plain so a graph goes the moment nothing uses it."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    cap = capture(model, (torch.randn(4, 8),), {}, grad=True)
    m = ComponentMeasurement(model, [cap.calls[""]], TimingConfig(min_run_time=0.001, warmup=1))
    gc.disable()
    try:
        roots, grads, wrt = m._graph(m.batches[0], seed=0)
        probe = weakref.ref(roots[0])
        del roots, grads, wrt
        assert probe() is None
        found = tensors_in({"a": [torch.ones(1)], "b": (torch.zeros(1),)})
        assert [t.item() for t in found] == [1.0, 0.0]
    finally:
        gc.enable()


def test_backward_graphs_past_the_allowance_are_built_one_at_a_time():
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    batches = [capture(model, (torch.randn(8, 16),), {}, grad=True).calls[""] for _ in range(3)]
    tight = TimingConfig(min_run_time=0.002, warmup=1, graph_allowance_bytes=15_000)  # one graph fits, not two
    m = ComponentMeasurement(model, batches, tight, graph_bytes=10_000)
    assert not m.graphs_fit() and not m.frees_graphs()
    stmt = m.rotation("backward")
    assert isinstance(stmt, GraphCycle)

    def batch_per_block(cycle: GraphCycle) -> list[int]:
        seen = []
        for block in range(9):
            cycle.before_block(block, 9)
            seen.append(cycle.index)
            cycle()
        return seen

    assert batch_per_block(stmt) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and stmt.switches == 2
    # Given batch 2's graph (one the forward phase left), the turn starts there.
    given = GraphCycle(lambda i: m._graph(batches[i], seed=i), 3, m._graph(batches[2], seed=2), 2)
    assert batch_per_block(given) == [2, 2, 2, 0, 0, 0, 1, 1, 1] and given.switches == 2
    # Five blocks on two batches: three and two, one graph built between them (and counted as graph time), not two,
    # two and a last block that builds batch 0's again.
    two = GraphCycle(lambda i: m._graph(batches[i], seed=i), 2, m._graph(batches[0], seed=0))
    seen = []
    for block in range(5):
        two.before_block(block, 5)
        seen.append(two.index)
        two()
    assert seen == [0, 0, 0, 1, 1] and two.switches == 1 and two.build_s > 0
    result = m.backward()
    assert any("one batch at a time" in n for n in result.notes)
    roomy = ComponentMeasurement(model, batches, TimingConfig(min_run_time=0.002, warmup=1), graph_bytes=10_000)
    assert roomy.graphs_fit() and not isinstance(roomy.rotation("backward"), GraphCycle)
    # A hierarchy re-measurement holds a parent and its child at once: one graph at a time each.
    assert isinstance(roomy.rotation("backward", one_graph=True), GraphCycle)


def test_a_graph_past_the_allowance_is_differentiated_freeing_as_a_training_step_does():
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    batches = [capture(model, (torch.randn(8, 16),), {}, grad=True).calls[""] for _ in range(2)]
    cfg = TimingConfig(min_run_time=0.002, warmup=1, graph_allowance_bytes=5_000)
    m = ComponentMeasurement(model, batches, cfg, graph_bytes=10_000, saved_bytes=6_000)
    assert m.frees_graphs()
    # Outputs and their gradients past the allowance, but not what freeing lets go: the graph is retained.
    assert not ComponentMeasurement(model, batches, cfg, graph_bytes=10_000, saved_bytes=1_000).frees_graphs()
    stmt = m.rotation("backward")
    assert isinstance(stmt, FreshGraphs) and one_call_per_block(stmt)
    built = []
    build = stmt.build
    stmt.build = lambda i: built.append((i, build(i))) or built[-1][1]
    for block in range(4):
        stmt.before_block(block, 4)
        stmt()
        with pytest.raises(RuntimeError, match="second time"):  # the graph was freed as backward went
            _grad(built[-1][1])
    assert [i for i, _ in built] == [0, 1, 0, 1]  # a graph per call, the batches in turn
    result = m.backward()
    assert any("each call on a graph of its own" in n for n in result.notes)
    assert all(b.calls == 1 for b in result.timing.blocks)  # one call per block: no forward inside a timed one
    # The same counts and allocator peak as on a retained graph (the allocator peak counts what the phase
    # allocates; freeing what the forward saved does not lower it).
    retained = ComponentMeasurement(model, batches, TimingConfig(min_run_time=0.002, warmup=1), graph_bytes=10_000)
    other = retained.backward()
    assert (result.counts.flops, result.counts.bytes_moved) == (other.counts.flops, other.counts.bytes_moved)
    assert result.peak_memory_bytes == other.peak_memory_bytes


def test_the_plan_groups_captures_within_the_allowance_and_rotates_only_what_fits_in_cache():
    sizes = {"": 10, "a": 40 * 2**20, "b": 30 * 2**20, "c": 10 * 2**20, "d": 100 * 2**20}
    plan = memory.plan(sizes, model_bytes=100 * 2**20, saved_bytes=300 * 2**20, batches=3, cache=32 * 2**20)
    assert plan.allowance_bytes == 100 * 2**20
    assert plan.batches_for("a") == 1 and plan.batches_for("b") == 3 and plan.batches_for("d") == 1
    assert plan.group(["", "a", "b", "c", "d"]) == ["", "a"]  # a (40) + b (3 x 30) would pass 100
    assert plan.group(["b", "c"]) == ["b"]
    assert plan.group(["d"]) == ["d"]  # one component always makes a group
    assert plan.record()["batch0_only"] == ["a", "d"]
    # Outputs past the cache too (a language model's head: 12 MB in, 0.8 GB of logits out).
    with_outputs = memory.plan(sizes, 100 * 2**20, 300 * 2**20, 3, 32 * 2**20, output_bytes={"c": 800 * 2**20})
    assert with_outputs.batches_for("c") == 1 and with_outputs.record()["batch0_only"] == ["a", "c", "d"]
    # What a call writes: outputs and saved activations together past the cache (a block that reads and returns
    # 12 MiB and saves 300 MiB), though neither alone is; parameters do not count (a lookup reads a few rows of a
    # large table).
    mib = 2**20
    written = memory.plan({"blk": 12 * mib, "ln": 12 * mib}, 100 * mib, 300 * mib, 3, 32 * mib,
                          output_bytes={"blk": 12 * mib, "ln": 12 * mib}, saved_by_component={"blk": 300 * mib, "ln": 1 * mib})
    assert written.batches_for("blk") == 1 and written.batches_for("ln") == 3
    assert "312 MiB of outputs and saved activations" in written.past_cache("blk") and written.past_cache("ln") is None


def test_a_graph_holds_what_autograd_saved_and_the_outputs_with_their_gradients():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 512))
    cap = capture(model, (torch.randn(3, 4),), {}, grad=True)
    assert cap.output_bytes["2"] == 3 * 512 * 4 and cap.output_bytes[""] == 3 * 512 * 4
    assert cap.graph_bytes("2") == cap.saved_bytes["2"] + 2 * 3 * 512 * 4  # the head's logits dominate
    assert cap.graph_bytes("no.such") is None


@pytest.mark.parametrize("text,expected", [("24GB", 24 * 10**9), ("1.5GiB", int(1.5 * 2**30)), ("800mb", 800 * 10**6),
                                           ("123", 123)])
def test_memory_sizes_parse(text, expected):
    assert memory.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1GB", "0"])
def test_bad_memory_sizes_say_what_to_give(text):
    with pytest.raises(CbsiteError, match="memory limit"):
        memory.parse_size(text)


def test_a_limit_below_what_the_process_holds_is_refused():
    with pytest.raises(CbsiteError, match="below what the process already holds"):
        with memory.MemoryLimit(1024, torch.device("cpu")):
            pass


def test_a_large_model_is_preserved_through_a_file_not_a_second_copy_in_memory(monkeypatch):
    monkeypatch.setattr(restore, "SPILL_BYTES", 0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with restore.preserved(model):
        model(torch.randn(8, 4))  # BatchNorm's statistics move
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model[0].weight.grad.mul_(3)
        model.to(torch.float64)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)
    assert torch.equal(model[0].weight.grad, torch.ones(4, 4))


def test_a_collections_own_model_is_not_kept_and_a_callers_is(monkeypatch):
    """`cbsite collect` builds the model for the collection and drops it after: nothing copies its values to put back.
    A model handed to profile_model by a caller is kept (restore.preserved) and comes back as it was."""
    from cbsite.collector import collect as collect_module
    from cbsite.collector import profiler
    from cbsite.collector.config import CollectConfig
    from cbsite.collector.request import CollectRequest

    kept = []
    real = profiler.preserved

    def recording(model):
        kept.append(model)
        return real(model)

    monkeypatch.setattr(profiler, "preserved", recording)
    config = CollectConfig(max_depth=1, min_run_time=0.002, warmup=1, progress=False, calibrate=False, peak_flops=1e11,
                           peak_bandwidth=1e10, step=False, plugins=())
    run = collect_module.collect(CollectRequest("dlrm", {"size": "tiny"}, config=config, batches=1))
    assert kept == [] and run.meta["counts"]["measured"] > 0
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profiler.profile_model(model, [((torch.randn(8, 4),), {})], dataclasses.replace(config, dtype="bfloat16"))
    assert kept == [model]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)


def test_objects_older_than_a_collection_are_frozen_inside_it_and_a_callers_freeze_is_left_alone():
    """memory.older_objects_frozen: inside, what existed on entry is out of the cyclic collector's walks; garbage made
    inside is still collected; on exit nothing stays frozen. Where the caller froze objects, it does nothing."""
    gc.unfreeze()
    with memory.older_objects_frozen():
        assert gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None and gc.get_freeze_count() <= frozen  # collected, and nothing frozen by the collection
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        made_since = [[] for _ in range(100)]  # objects the caller did not freeze: freezing again would take them
        with memory.older_objects_frozen():
            assert 0 < gc.get_freeze_count() <= mine  # nothing frozen anew (a frozen object may die meanwhile)
        assert 0 < gc.get_freeze_count() <= mine  # and the caller's not handed back
        del made_since
    finally:
        gc.unfreeze()


def test_the_profilings_gradients_go_before_a_spilled_models_values_are_read_back(monkeypatch):
    """The whole-model step leaves gradients; holding them while the spilled values come back raised dlrm medium's
    peak above the step's own. They go (and the heap is trimmed) before the file is read."""
    monkeypatch.setattr(restore, "SPILL_BYTES", 0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    original = torch.ones_like(model[0].weight)
    model[0].weight.grad = original  # the caller's own gradient stays, the same object
    seen, trims = [], []
    load = torch.load

    def watched_load(*args, **kwargs):
        seen.append([p.grad for p in model.parameters()])
        return load(*args, **kwargs)

    monkeypatch.setattr(restore.torch, "load", watched_load)
    monkeypatch.setattr(restore, "trim_heap", lambda: trims.append(1))
    with restore.preserved(model):
        model(torch.randn(3, 4)).sum().backward()  # what a training step leaves
        assert all(p.grad is not None for p in model.parameters())
    assert len(seen) == 1 and seen[0][0] is original and all(g is None for g in seen[0][1:]) and trims == [1]
    assert model[0].weight.grad is original and torch.equal(original, torch.ones(4, 4))
    assert all(p.grad is None for p in list(model.parameters())[1:])


def test_a_peak_pass_leaves_what_it_freed_with_the_system():
    """The profiler's own allocations, made between the run's, kept the heap what the run freed: dlrm medium's
    backward peak pass left its gradients' worth resident, and its timing allocated afresh beside it."""
    import platform

    from cbsite.collector.cpu_memory import cpu_peak

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    resident = memory.resident_bytes

    def run() -> None:
        kept = [torch.ones(64 * 1024) for _ in range(2000)]  # 256 KiB each, about 500 MiB, from glibc's heap
        del kept

    memory.release_freed()
    before = resident()
    assert cpu_peak(run) >= 2000 * 256 * 1024
    assert resident() < before + 100 * 2**20


def test_what_a_components_measurement_left_in_the_heap_goes_back_before_the_next():
    """dlrm medium's sparse_arch raised the peak by 0.59 GB in one run, allocating its gradients beside memory the
    whole model's measurement had freed but glibc kept. A measurement that leaves more than the plan's allowance
    resident (here its floor, TRIM_LEFT_BYTES) hands its freed heap back, and run.json says after which component and
    how much; a smaller leftover stays (the next component would fault its pages in again in its first block)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    got = _script("heap_left_by_a_component")
    returned = got["memory"]["heap_returned"]
    after = {r["path"]: r for r in returned["most_after"]}
    # The large Churn's timed calls freed 256 MiB each, kept resident by the settings: handed back after its
    # measurement and after the whole model's (which runs it too); nothing after the Linear's, nor after the small
    # Churn's 16 MiB, within the allowance.
    assert got["memory"]["allowance_bytes"] == memory.TRIM_LEFT_BYTES
    assert {"1", ""} <= set(after) and not {"0", "2"} & set(after), returned
    for path in ("1", ""):
        assert after[path]["left_bytes"] > memory.TRIM_LEFT_BYTES and after[path]["returned_bytes"] >= 200 * 2**20
    assert returned["times"] >= 2 and returned["bytes"] == sum(r["returned_bytes"] for r in returned["most_after"])


def test_a_small_peak_pass_leaves_the_heap_alone(monkeypatch):
    """A trimmed heap faults its pages in again on the next calls: after a trim behind every peak pass, 53 of dlrm
    medium's 92 first timed blocks were over 5 % slower than the rest of theirs. Only a pass that left more than
    TRIM_LEFT_BYTES resident trims: a peak pass, and a real counting pass (whose dense gradients of whole tables, left
    resident, raised dlrm medium's peak under the timing that followed)."""
    from cbsite.collector import cpu_memory
    from cbsite.collector.measure import _counted_for_real

    cpu_memory.cpu_peak(lambda: None)  # the profiler's first use in a process makes its own lasting allocations
    trims = []
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(1))
    left = []
    for run_pass in (cpu_memory.cpu_peak, _counted_for_real):
        trims.clear()
        run_pass(lambda: torch.ones(1024) * 2)
        assert trims == [], run_pass
        run_pass(lambda: left.append(torch.ones(memory.TRIM_LEFT_BYTES // 4 + 2**20)))  # kept: resident after
        assert trims == [1], run_pass


def test_the_capture_sees_which_modules_write_into_their_inputs():
    """In-place modules are known from the full model's version counters, with no replay of their own."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Sequential(nn.Tanh()))
    cap = capture(model, (torch.randn(2, 4),), {}, grad=True)
    seen = {p: calls[0].mutates_inputs for p, calls in cap.calls.items()}
    assert seen == {"": False, "0": False, "1": True, "2": False, "2.0": False}
    m = ComponentMeasurement(model[1], [cap.calls["1"]], TimingConfig(min_run_time=0.001, warmup=1))
    assert m.inplace


def test_a_capture_forward_keeps_nothing_autograd_saves_and_the_census_sees_it_all():
    """A group's capture forward runs with grad on (the model takes its training path; inputs require grad as in
    training) but lets every activation go as the forward goes: the allocator's peak is a few layers' worth, not the
    whole forward's, and its inputs and flags are those the census forward sees."""
    from cbsite.collector.cpu_memory import cpu_peak

    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(16)])
    x = torch.randn(64, 256, requires_grad=True)
    kept: list = []
    census_peak = cpu_peak(lambda: kept.append(capture(model, (x,), {}, grad=True, paths=["8.0"])))
    group_peak = cpu_peak(lambda: kept.append(capture(model, (x,), {}, grad=True, paths=["8.0"], census=False)))
    activation = 64 * 256 * 4
    assert census_peak > 16 * activation  # the census's forward holds every Linear's input and Tanh's output
    assert group_peak < 6 * activation  # the group's: what is alive at once, and its one clone
    census, group = kept
    (a,), (b,) = census.calls["8.0"], group.calls["8.0"]
    assert torch.equal(a.args[0], b.args[0]) and a.requires_grad == b.requires_grad == [True] and b.grad_enabled


def test_the_whole_models_inputs_are_the_batch_and_take_no_forward():
    from cbsite.collector.capture import root_calls

    class Doubling(nn.Module):  # writes into its input: the census sees it, and the root's call says so
        def forward(self, x, scale=None):
            x.mul_(2)
            return x * scale

    x, scale = torch.randn(3, 4), torch.ones(4, requires_grad=True)
    seen = capture(Doubling(), (x.clone(),), {"scale": scale}, grad=True)
    (call,) = root_calls((x,), {"scale": scale}, True, seen.mutates_inputs[""])
    (captured,) = seen.calls[""]
    assert torch.equal(call.args[0], x) and call.args[0] is not x and call.kwargs["scale"] is not scale
    assert call.requires_grad == captured.requires_grad == [False, True]
    assert call.grad_enabled and call.mutates_inputs is True and captured.mutates_inputs is True
    assert capture(nn.Linear(4, 4), (x,), {}, grad=True).mutates_inputs == {"": False}


@settings(max_examples=200, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 400), min_size=1, max_size=12),
    graphs=st.lists(st.integers(0, 600), min_size=12, max_size=12),
    headroom=st.integers(0, 3000),
)
def test_a_group_never_holds_more_than_the_whole_models_measurement(inputs, graphs, headroom):
    """Property: a group's inputs and what measuring its largest member holds stay within the room of the whole model's
    measurement, or within the allowance, whichever is larger (a lone member excepted: it must be captured anyway);
    the groups cover the candidates in order; no room is taken where there is none (headroom 0)."""
    mib = 2**20
    paths = [f"m{i}" for i in range(len(inputs))]
    plan = memory.plan({p: n * mib for p, n in zip(paths, inputs)}, 400 * mib, 0, 3, 32 * mib,
                       saved_by_component={p: g * mib for p, g in zip(paths, graphs)})
    plan = dataclasses.replace(plan, headroom_bytes=headroom * mib)
    rest, groups = list(paths), []
    while rest:
        group = plan.group(rest)
        assert group == rest[: len(group)] and group
        groups.append(group)
        rest = rest[len(group):]
        held = sum(plan.input_bytes[p] * plan.batches_for(p) for p in group)
        largest = max(plan.working_bytes(p) for p in group)
        assert len(group) == 1 or held <= max(plan.allowance_bytes, plan.headroom_bytes - largest)
    plain = dataclasses.replace(plan, headroom_bytes=0)
    first = plain.group(paths)
    assert len(first) == 1 or sum(plain.input_bytes[p] * plain.batches_for(p) for p in first) <= plain.allowance_bytes
    assert len(plan.group(paths)) >= len(first)  # room only ever adds to a group
    # A rider's group (capture_plan.GroupedCaptures): batch 0's inputs within the bound, a prefix of the group without it.
    bound = plan.allowance_bytes
    cut = plan.group(paths, batch0_room=bound)
    assert cut == plan.group(paths)[: len(cut)] and cut
    assert len(cut) == 1 or sum(plan.input_bytes[p] for p in cut) <= bound


def test_the_whole_model_is_captured_alone_without_a_forward():
    from cbsite.collector.pipeline.capture_plan import planned_captures

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    batches = [((torch.randn(3, 4),), {}) for _ in range(3)]
    census, plan, captures = planned_captures(model, batches, True, torch.device("cpu"))
    captures.held = {"0": [[]]}  # a group held before: let go first
    root = captures.calls("", lambda: ["", "0", "1", "2"])
    assert captures.forwards == 0 and set(captures.held) == {""}
    assert [torch.equal(calls[0].args[0], b[0][0]) for calls, b in zip(root, batches)] == [True] * plan.batches_for("")
    assert captures.calls("0", lambda: ["0", "1", "2"])[0][0].args[0].shape == (3, 4)
    assert "" not in captures.held


def test_after_a_census_on_shapes_the_first_forward_that_does_not_fit_is_the_models_own(monkeypatch):
    """No real forward of the whole model has run after a census on fake tensors: a capture that runs out of memory
    before one has stops the collection with the one line a real census would give; after one has, it is that
    component's failure (`failed: out of memory`)."""
    import cbsite.collector.pipeline.capture_plan as capture_plan

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    batches = [((torch.randn(3, 4),), {}) for _ in range(2)]
    census, plan, _ = capture_plan.planned_captures(model, batches, True, torch.device("cpu"))
    census.on_shapes, census.calls, census.complete = True, {}, False
    real_capture = capture_plan.capture
    failing = {"on": True}

    def capture_or_fail(*args, **kwargs):
        if failing["on"]:
            raise MemoryError("can't allocate memory")
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(capture_plan, "capture", capture_or_fail)
    captures = capture_plan.GroupedCaptures(model, batches, True, plan, census)
    with pytest.raises(CbsiteError, match="own forward on example batch 0 does not fit in memory"):
        captures.calls("0", lambda: ["0"])
    failing["on"] = False
    captures.calls("2", lambda: ["2"])  # runs the whole forward (the last module's calls end it)
    assert captures.whole_forward_ran
    failing["on"] = True
    with pytest.raises(capture_plan.CaptureOutOfMemory):
        captures.calls("1", lambda: ["1"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_memory_the_allocator_kept_goes_back_to_the_system():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    resident = memory.resident_bytes

    # Tensors below glibc's mmap threshold come from its heap; every other one freed leaves holes it keeps.
    kept = [torch.ones(64 * 1024) for _ in range(2000)]  # 256 KiB each, about 500 MiB in all
    del kept[::2]
    before = resident()
    memory.release_freed()
    assert resident() < before - 100 * 2**20


def test_within_a_depth_the_components_replayed_on_batch_0_only_are_measured_last():
    from cbsite.collector.plan import breadth_first, component_tree

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2), nn.Sequential(nn.Tanh()))
    batch0_only = {"0", "0.0", "2.0"}
    order = [c.path for c in breadth_first(component_tree(model), later=lambda c: c.path in batch0_only)]
    assert order == ["", "1", "2", "0", "0.1", "0.0", "2.0"]  # still breadth-first by depth
    assert [c.path for c in breadth_first(component_tree(model))] == ["", "0", "1", "2", "0.0", "0.1", "2.0"]


def test_a_peak_reached_before_the_components_is_set_by_the_stage_that_reached_it():
    """No capture or measurement raised the peak: run.json names the earlier stage (not None, not a component)."""
    from cbsite.collector import memory

    stages = memory.StagePeaks()
    stages.done("setup_and_capture")
    raisers = memory.PeakRaisers(stages)
    setter = raisers.record()["peak_set_by"]
    assert setter["what"] == "stage" and setter["stage"] == "setup_and_capture"
    assert setter["peak_bytes"] == stages.peaks["setup_and_capture"]
