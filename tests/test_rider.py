"""The rider (capture.Rider): the first capture group after the whole model takes batch 0's inputs from the whole
model's forward peak pass, a forward that runs anyway, and the peak that pass measures is still the model's own."""

from __future__ import annotations

import torch

from cbsite.collector.capture import Rider, capture
from cbsite.collector.cpu_memory import cpu_peak
from tests.test_anchors import Stack, tight_allowance, work


def _model_and_batch():
    torch.manual_seed(0)
    return Stack(width=64, depth=3), ((torch.randn(64, 8),), {})


def test_the_rider_captures_what_a_capture_forward_does_and_leaves_its_clones_out_of_the_peak():
    model, (args, kwargs) = _model_and_batch()
    census = capture(model, args, kwargs, grad=True)
    paths = ["inp", "blocks.0", "blocks.1", "blocks.2", "head"]
    outs: list = []

    def forward() -> None:
        outs.clear()
        outs.append(model(*args, **kwargs))  # the graph is built and held, as the peak pass holds it

    forward()  # warm, as a peak pass is
    plain = [cpu_peak(forward) for _ in range(2)]
    assert plain[0] == plain[1] > 0
    rider = Rider(model, paths, census.counts)
    ridden = cpu_peak(rider.around(forward), rider.storages)
    assert ridden == plain[0]
    # Without leaving them out, the clones would have counted: the test can tell.
    counted = cpu_peak(Rider(model, paths, census.counts).around(forward))
    assert counted > plain[0]
    assert outs and outs[0].grad_fn is not None  # the ridden forward is the peak pass's own, graph and all
    for path in paths:
        got, want = rider.captured.calls[path], census.calls[path]
        assert len(got) == len(want) == 1
        assert torch.equal(got[0].args[0], want[0].args[0]), path
        assert got[0].requires_grad == want[0].requires_grad and got[0].grad_enabled == want[0].grad_enabled


def test_a_rider_whose_forward_did_not_make_every_call_captures_nothing():
    model, (args, kwargs) = _model_and_batch()
    census = capture(model, args, kwargs, grad=True)
    rider = Rider(model, ["inp", "head"], census.counts)
    rider.around(lambda: model.inp(*args))()  # `head` never called
    assert rider.captured is None and rider.storages() == set()


def test_a_collection_takes_its_first_groups_batch_0_from_the_root_peak_pass(monkeypatch, fast_config):
    """An allowance the census cannot keep batch 0 within (as GPT-2 small's at 8 x 512): the first group after the
    root rides on the root's forward peak pass, one capture forward fewer; the rows measure the same work, and the
    root's peak is the same as without the rider."""
    from cbsite.collector.profiler import profile_model

    model, batches, _ = tight_allowance(monkeypatch)
    ridden = profile_model(model, batches, fast_config)
    monkeypatch.setattr(Rider, "around", lambda self, fn: fn)  # the peak pass runs without the rider's hooks
    plain = profile_model(model, batches, fast_config)
    assert ridden.meta["memory"]["capture_rode_root"] is True
    assert plain.meta["memory"]["capture_rode_root"] is False
    assert ridden.meta["memory"]["capture_forwards"] == plain.meta["memory"]["capture_forwards"] - 1
    assert work(ridden) == work(plain) and len(work(plain)) >= 2 * 14

    def root_peak(run):
        table = run.table().filter((run.table()["path"] == "") & (run.table()["phase"] == "forward"))
        return table["peak_memory_bytes"].to_list()

    assert root_peak(ridden) == root_peak(plain) and root_peak(plain)[0] > 0
