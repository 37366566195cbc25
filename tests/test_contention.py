"""Contention: timing pauses for a quiet machine when blocks keep waiting for a CPU, gives up under a load that
stays, and never waits where CBSITE_QUIET_WAIT_S=0 says the machine will not quieten (the suite runs so)."""

from __future__ import annotations

import pytest
import torch

from cbsite.collector.timing import blocks, contention
from cbsite.errors import CbsiteError


def test_waiting_for_quiet_gives_up_under_a_load_that_stays(monkeypatch):
    monkeypatch.setattr(contention, "_busy", {"in_a_row": 0, "last": 0.0})
    monkeypatch.setattr(contention, "contended", lambda wait, wall: True)  # a machine that never quietens
    calls = []
    monkeypatch.setattr(contention.time, "sleep", lambda s: calls.append(s))
    for _ in range(contention.GIVE_UP_AFTER):
        assert contention.wait_for_quiet(0.01) is False
    spent = len(calls)
    assert contention.wait_for_quiet(10.0) is False and len(calls) == spent  # no more waiting for now
    monkeypatch.setattr(contention, "_busy", {"in_a_row": contention.GIVE_UP_AFTER, "last": -1e9})
    monkeypatch.setattr(contention, "contended", lambda wait, wall: False)
    assert contention.wait_for_quiet(0.01) is True and contention._busy["in_a_row"] == 0  # tried again later


@pytest.mark.parametrize(("value", "seconds"), [("", 5.0), ("0", 0.0), (" 2.5 ", 2.5)])
def test_the_quiet_wait_comes_from_the_environment(monkeypatch, value, seconds):
    monkeypatch.setenv("CBSITE_QUIET_WAIT_S", value)
    assert blocks.TimingConfig().quiet_wait_s == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_quiet_wait_that_is_no_number_of_seconds_says_what_to_set(monkeypatch, value):
    monkeypatch.setenv("CBSITE_QUIET_WAIT_S", value)
    with pytest.raises(CbsiteError, match=r"CBSITE_QUIET_WAIT_S=.* set it to 0 or more"):
        blocks.TimingConfig()


@pytest.mark.parametrize("wait_s", [0.0, 0.01])
def test_every_block_contended_is_flagged_and_waits_only_when_allowed(monkeypatch, wait_s):
    """Under a load that never goes, a component's blocks all wait for a CPU: the row says `contended`, and timing
    paused for a quiet machine MAX_QUIET_WAITS times, or never with a wait of 0."""
    monkeypatch.setattr(blocks, "contended", lambda wait, wall: True)
    waits = []
    monkeypatch.setattr(blocks, "wait_for_quiet", lambda max_s: waits.append(max_s) or False)
    a = torch.randn(32, 32)
    timing = blocks.time_fn(lambda: a @ a, 1, blocks.TimingConfig(min_run_time=0.005, quiet_wait_s=wait_s))
    assert timing.flagged and any(n.startswith("contended:") for n in timing.notes)
    assert len(waits) == (blocks.MAX_QUIET_WAITS if wait_s else 0)
