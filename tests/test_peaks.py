"""Honest peaks: calibration in a clean worker (repeats, start and end), a row that beats the peak re-timed against
dense matmuls of known FLOPs (a miscount never raises the peak: it is FLOPs suspect), null ratios for FLOP-free
modules, and never a silent MFU above 100 %.

The collections here calibrate for real (a few seconds each); what they assert never depends on how
fast the machine is: a peak that is deliberately low is given or planted, never hoped for.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from cbsite import tree
from cbsite.collector import CollectConfig, counting, device, peaks, profile
from cbsite.collector.clean_worker import kept_worker
from cbsite.collector.measure import ComponentMeasurement


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.LayerNorm(256), nn.Linear(256, 64))


def rows_of(run) -> list[dict]:
    return run.table().to_dicts()


def label(row: dict) -> str:
    return f"{row['path'] or '<root>'} ({row['phase']})"


def assert_no_silent_mfu(run) -> None:
    """Every row above 100 % MFU carries a note (timing noise, or FLOPs suspect) and is named by a run warning."""
    text = " ".join(run.meta["warnings"])
    for row in rows_of(run):
        if row["mfu"] is not None and row["mfu"] > 1:
            assert any(n.startswith((peaks.MFU_NOTE, peaks.FLOPS_SUSPECT_NOTE)) for n in row["notes"]), label(row)
            assert label(row) in text, f"{label(row)} has MFU {row['mfu']:.2f} and no run warning names it"


@pytest.fixture(scope="module")
def low_given_peak_run():
    """A small MLP with a given peak of 1 MFLOP/s (every matmul beats it) and a given 1 B/s bandwidth peak."""
    config = CollectConfig(min_run_time=0.01, warmup=1, peak_flops=1e6, peak_bandwidth=1.0, progress=False)
    return profile(mlp(), torch.randn(32, 128), config=config)


@pytest.mark.slow
def test_low_given_peak_warns_and_no_mfu_above_one_goes_unnamed(low_given_peak_run):
    run = low_given_peak_run
    warnings = run.meta["warnings"]
    assert any("beat the peak of 0.001 GFLOP/s (given)" in w for w in warnings), warnings
    assert_no_silent_mfu(run)
    dev = run.meta["device"]
    shapes = dev["calibration"]["component_shapes"]
    assert shapes["peak_before"] == 1e6 and shapes["source_before"] == "given"
    assert {c["path"] for c in shapes["components"]} >= {"0", "3"}  # both Linears beat 1 MFLOP/s
    # The peak was raised by dense matmuls of known FLOPs (and says so), or kept with a warning.
    peak = dev["peak_flops"]["float32"]
    if peak > 1e6:
        assert dev["peak_source"]["flops"].startswith(("calibrated (component shapes: ", "calibrated (dense matmul "))
        assert any("the peak was raised to" in w for w in warnings)
    for table in (run.table("forward"), run.table("backward")):
        tree.self_check(tree.build_tree(table.to_dicts()))


@pytest.mark.slow
def test_flop_free_modules_have_null_mfu(low_given_peak_run):
    for row in rows_of(low_given_peak_run):
        if row["path"] in ("1", "2"):  # ReLU, LayerNorm
            assert row["flops"] == 0 and row["status"] == "measured"
            assert row["mfu"] is None and row["tflops_per_s"] is None and row["arithmetic_intensity"] is None
            assert row["bytes_moved"] > 0 and row["bandwidth_util"] is not None


@pytest.mark.slow
def test_bandwidth_above_one_is_a_note_not_a_peak_change(low_given_peak_run):
    run = low_given_peak_run
    assert run.meta["device"]["peak_bandwidth"] == 1.0 and run.meta["device"]["peak_source"]["bandwidth"] == "given"
    over = [row for row in rows_of(run) if row["bandwidth_util"] is not None]
    for row in over:
        assert row["bandwidth_util"] > 1 and peaks.BANDWIDTH_NOTE in row["notes"]
    # ... and a run warning naming them, as MFU above 100 % has: the site marks them suspect too.
    assert over and any(f"{len(over)} row(s) move more than the peak bandwidth" in w for w in run.meta["warnings"])


@pytest.mark.slow
def test_calibration_record_has_repeats_start_and_end(low_given_peak_run):
    cal = low_given_peak_run.meta["device"]["calibration"]
    # Calibrated on the thread count the run timed with (one on CPU unless --threads), not the caller's.
    assert cal["repeats"] == device.CALIBRATION_REPEATS
    assert cal["num_threads"] == low_given_peak_run.meta["config"]["num_threads"]
    assert cal["end_repeats"] == device.END_CALIBRATION_REPEATS
    for when, repeats in (("start", device.CALIBRATION_REPEATS), ("end", device.END_CALIBRATION_REPEATS)):
        record = cal[when]
        assert len(record["repeats"]) == repeats
        assert record["flops"] == max(r["flops"] for r in record["repeats"]) > 0
        assert record["bandwidth"] == max(r["bandwidth"] for r in record["repeats"]) > 0
        assert record["method"] == "clean worker (spawn)"
    # The end times the start's best shape only: drift on the same work.
    assert cal["start"]["matmul_shapes"] == [list(x) for x in device.MATMUL_SHAPES]
    assert cal["end"]["matmul_shapes"] == [cal["start"]["best_matmul_shape"]] == [cal["end"]["best_matmul_shape"]]
    assert cal["used"] == {"flops": "given", "bandwidth": "given"}


def test_shape_recalibration_raises_a_low_calibrated_peak(monkeypatch):
    """A calibration planted at 1 MFLOP/s: the Linears beat it, their own shapes raise the peak."""

    def low(dtype, num_threads, *args, **kwargs):
        repeats = [{"flops": 1e6, "bandwidth": 1e12, "best_matmul_shape": [256, 256, 256]}] * 2
        return {"flops": 1e6, "bandwidth": 1e12, "detail": {"method": "planted", "best_matmul_shape": [256, 256, 256],
                                                           "repeats": repeats, "seconds": 0.0}}

    monkeypatch.setattr(device, "calibrate_cpu", low)
    monkeypatch.setattr(peaks, "calibrate_cpu", low)
    replays = []  # the shapes come from the counting pass: no component is replayed (or captured) again for them
    monkeypatch.setattr(ComponentMeasurement, "replay", lambda self, *a, **k: replays.append(a) or (lambda: None))
    config = CollectConfig(min_run_time=0.01, warmup=1, progress=False, phases=("forward",))
    run = profile(mlp(), torch.randn(32, 128), config=config)
    assert replays == []
    dev = run.meta["device"]
    assert dev["peak_flops"]["float32"] > 1e6
    assert dev["peak_source"]["flops"].startswith(("calibrated (component shapes: ", "calibrated (dense matmul "))
    assert dev["calibration"]["used"]["flops"] == "start"  # start and end agree: 1 MFLOP/s
    components = dev["calibration"]["component_shapes"]["components"]
    linear = next(c for c in components if c["path"] == "0")
    assert [(op["op"], op["calls"]) for op in linear["ops"]] == [("addmm(256, 32x128, 128x256)", 1)]  # as counted
    assert linear["ops"][0]["flops"] == 2 * 32 * 128 * 256 and linear["ceiling_flops_per_s"] > 1e6
    assert linear["count_verified"]  # a Linear's whole count is its addmm's 2*M*N*K
    # The reference matmul is sized to the row's FLOPs per call: a square n^3 within 25 % of them, n a multiple of 8.
    n = int(linear["reference"]["op"].split("(")[1].split("x")[0])
    assert n % 8 == 0 and linear["reference"]["flops"] == 2 * n**3
    assert linear["reference"]["op"] == f"mm({n}x{n}, {n}x{n})" and abs(2 * n**3 / (2 * 32 * 128 * 256) - 1) < 0.25
    assert any("the peak was raised to" in w for w in run.meta["warnings"])
    assert not any(n.startswith(peaks.FLOPS_SUSPECT_NOTE) for r in rows_of(run) for n in r["notes"])  # counts are right
    assert_no_silent_mfu(run)


def inflated_conv_formula(factor: int):
    """A convolution FLOP formula `factor` times too high: a miscount the peak check must not take for speed."""
    from torch.utils.flop_counter import conv_flop

    def formula(*args, **kwargs):  # on shapes, as FlopCounterMode calls a custom formula
        return factor * conv_flop.__wrapped__(*args, **kwargs)  # torch's forward count (right for any groups)

    return formula


def depthwise() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(), nn.Conv2d(32, 16, 1))


def test_a_miscounted_module_is_flops_suspect_and_never_raises_the_peak(monkeypatch):
    """A convolution counted 1000x too high beats the calibrated peak; re-timing it on its own shapes would time its
    own miscount. Dense matmuls of known FLOPs do not reach its rate: the peak stays what calibration measured, the
    row says FLOPs suspect and a run warning names it."""
    monkeypatch.setitem(counting.EXTRA_FLOP_FORMULAS, torch.ops.aten.convolution, inflated_conv_formula(1000))
    config = CollectConfig(min_run_time=0.01, warmup=1, progress=False, phases=("forward",), step=False)
    run = profile(depthwise(), torch.randn(8, 32, 32, 32), config=config)
    dev = run.meta["device"]
    cal = dev["calibration"]
    calibrated = max(cal["start"]["flops"], cal["end"]["flops"])
    shapes = cal["component_shapes"]
    assert shapes["peak_before"] == calibrated
    # Not raised by the count: at most by a dense matmul that ran faster than the calibration (noise, a few %).
    peak = dev["peak_flops"]["float32"]
    assert peak < 2 * calibrated
    assert dev["peak_source"]["flops"] == "calibrated" or dev["peak_source"]["flops"].startswith("calibrated (dense matmul ")
    conv = next(c for c in shapes["components"] if c["path"] == "0")
    assert conv["not_independent"] and conv["ops"] == [] and not conv["count_verified"]  # its conv call is not timed
    assert conv["reference"]["op"] == "mm(1024x1024, 1024x1024)"  # sized to its (inflated) FLOPs, at the cap
    rows = {r["path"]: r for r in rows_of(run)}
    text = " ".join(run.meta["warnings"])
    for path in ("0", ""):  # the convolution and the root that holds it
        row = rows[path]
        assert row["mfu"] > peaks.SUSPECT_FACTOR
        assert any(n.startswith(peaks.FLOPS_SUSPECT_NOTE) for n in row["notes"]), row["notes"]
        assert label(row) in text
    assert any(w.startswith(f"{peaks.FLOPS_SUSPECT_NOTE} for ") for w in run.meta["warnings"])
    assert_no_silent_mfu(run)


def test_a_verified_count_above_the_peak_is_noise_and_an_unverified_one_is_suspect():
    """Two rows at twice a peak no CPU reaches (10 TFLOP/s, given): the one whose count is its addmm's 2*M*N*K is timing
    noise (MFU note); the one counted 1000x its addmm is FLOPs suspect. Neither raises the peak: the dense matmuls of
    known FLOPs timed for them run far below it."""
    a = ("tensor", (64, 64), (64, 1), "float32", "cpu")
    addmm = ("aten::addmm", (("tensor", (64,), (1,), "float32", "cpu"), a, a), ())
    right = 2 * 64**3

    def row(path: str, flops: int) -> dict:
        return {"path": path, "phase": "forward", "status": "measured", "flops": flops, "call_count": 1, "notes": [],
                "latency_ms": flops / 2e13 * 1e3, "bytes_moved": 0}  # 20 TFLOP/s as counted

    rows = [row("right", right), row("wrong", 1000 * right)]
    counts = {p: counting.Counts(flops=r["flops"], bytes_moved=0, unsupported_ops=[], flops_by_op={}, op_calls={},
                                 matmul_calls={addmm: 1}) for p, r in (("right", rows[0]), ("wrong", rows[1]))}
    info = {"dtype": "float32", "num_threads": 1, "peak_flops": {"float32": 1e13}, "peak_bandwidth": None,
            "peak_source": {"flops": "given", "bandwidth": None}}
    warnings = peaks.check_peaks(rows, info, lambda path, phase: counts.get(path), shapes_budget_s=2.0)
    assert info["peak_flops"]["float32"] == 1e13 and info["peak_source"]["flops"] == "given"
    records = {r["path"]: r for r in info["calibration"]["component_shapes"]["components"]}
    assert records["right"]["count_verified"] and not records["wrong"]["count_verified"]
    assert records["wrong"]["reference"]["op"] == "mm(640x640, 640x640)"  # 1000 * 2 * 64^3 = 2 * 640^3
    noisy, suspect = rows
    assert [n.split(":")[0] for n in noisy["notes"]] == [peaks.MFU_NOTE]
    assert [n.split(":")[0] for n in suspect["notes"]] == [peaks.FLOPS_SUSPECT_NOTE]
    assert any(w.startswith(f"{peaks.FLOPS_SUSPECT_NOTE} for 1 row(s): wrong (forward)") for w in warnings), warnings
    assert any(w.startswith("MFU above 100 % remains for 1 row(s) after re-calibration: right (forward)") for w in warnings)


def test_dense_matmul_flops_come_from_shapes_alone():
    def t(*shape):
        return ("tensor", shape, (), "float32", "cpu")

    assert peaks.dense_matmul_flops(("aten::mm", (t(4, 5), t(5, 6)), ())) == 2 * 4 * 5 * 6
    assert peaks.dense_matmul_flops(("aten::addmm", (t(6), t(4, 5), t(5, 6)), ())) == 2 * 4 * 5 * 6
    assert peaks.dense_matmul_flops(("aten::bmm", (t(3, 4, 5), t(3, 5, 6)), ())) == 2 * 3 * 4 * 5 * 6
    assert peaks.dense_matmul_flops(("aten::baddbmm", (t(3, 4, 6), t(3, 4, 5), t(3, 5, 6)), ())) == 2 * 3 * 4 * 5 * 6
    conv = ("aten::convolution", (t(1, 8, 9, 9), t(8, 1, 3, 3), ("value", None)), ())
    assert peaks.dense_matmul_flops(conv) is None  # a formula's word, not a shape's
    sig = peaks.reference_matmul(2 * 200**3, "bfloat16", "cpu")
    assert sig == ("aten::mm", (("tensor", (200, 200), (200, 1), "bfloat16", "cpu"),) * 2, ())
    assert peaks.reference_matmul(1.0, "float32", "cpu")[1][0][1] == (peaks.REFERENCE_N[0],) * 2
    assert peaks.reference_matmul(1e15, "float32", "cpu")[1][0][1] == (peaks.REFERENCE_N[1],) * 2


def test_derive_ratios_are_null_where_the_numerator_is_zero():
    row = {"latency_ms": 1.0, "flops": 0, "bytes_moved": 4096}
    tree.derive_ratios(row, 1e9, 1e9)
    assert row["tflops_per_s"] is None and row["mfu"] is None and row["arithmetic_intensity"] is None
    assert row["bandwidth_gbps"] == pytest.approx(4096 / 1e-3 / 1e9) and row["bandwidth_util"] is not None
    row = {"latency_ms": 1.0, "flops": 1_000_000, "bytes_moved": 0}  # 1 GFLOP/s
    tree.derive_ratios(row, 1e9, 1e9)
    assert row["mfu"] == pytest.approx(1.0) and row["bandwidth_gbps"] is None and row["bandwidth_util"] is None
    assert row["arithmetic_intensity"] is None


def test_recorded_shapes_replay_standalone():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    counts = counting.count(lambda: lin(x).sum().backward())[1]  # the counting pass records the calls
    calls = list(counts.matmul_calls)
    names = [c[0] for c in calls]
    assert names[0] == "aten::addmm" and names.count("aten::mm") == 2 and not counts.undescribed_matmuls  # dX and dW
    assert sum(counts.matmul_calls.values()) == 3
    timed = peaks.time_signatures(calls, torch.get_num_threads(), repeats=1, min_run_time=0.001)
    assert timed[0]["flops"] == 2 * 4 * 16 * 8 and all(t["seconds"] > 0 for t in timed)
    # The FLOPs the collecting process counts on meta tensors (the worker then only times) are the worker's own.
    flops = peaks.signature_flops(calls)
    assert flops == [t["flops"] for t in timed]
    given = peaks.time_signatures(calls, torch.get_num_threads(), repeats=1, min_run_time=0.001, flops=flops)
    assert [t["flops"] for t in given] == flops and all(t["seconds"] > 0 for t in given)
    # The budget grows with the time the components spent in timed blocks, within 1-5 s.
    assert [peaks.shapes_budget(t) for t in (10.0, 100.0, 1000.0)] == [1.0, 2.0, 5.0]
    # Once the budget is spent no call is started: with none, the first is not either, and each says why.
    spent = peaks.time_signatures(calls, torch.get_num_threads(), repeats=1, min_run_time=0.001, budget_s=0.0)
    assert [t["seconds"] for t in spent] == [None] * 3 and all("budget of 0 s was spent" in t["error"] for t in spent)


def test_clean_worker_and_its_in_process_fallback(monkeypatch, tmp_path):
    main = vars(sys.modules["__main__"])
    before = {k: main[k] for k in ("__file__", "__spec__") if k in main}
    assert device.in_clean_worker(math.factorial, 5) == (120, "clean worker (spawn)")
    assert {k: main[k] for k in ("__file__", "__spec__") if k in main} == before  # the caller's main is restored

    # A script with no `if __name__ == "__main__":` guard: the worker must not run its top level again.
    script = tmp_path / "unguarded.py"
    script.write_text("import math\nfrom cbsite.collector import device\nprint('top level ran')\n"
                      "print(device.in_clean_worker(math.factorial, 5))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.count("top level ran") == 1 and "(120, 'clean worker (spawn)')" in out.stdout

    class Broken:
        def __init__(self, *args, **kwargs):
            raise OSError("no processes here")

    from cbsite.collector import clean_worker

    monkeypatch.setattr(clean_worker, "ProcessPoolExecutor", Broken)
    result, method = device.in_clean_worker(math.factorial, 5)
    assert result == 120 and method.startswith("in-process (the clean worker failed: OSError: no processes here")


def test_a_kept_worker_serves_every_clean_job_of_its_block_and_is_gone_after(tmp_path):
    """A collection's calibrations share one spawned worker (its start and torch import are paid once)."""
    with kept_worker(start_now=True):
        with kept_worker():  # nested: the outer block's worker
            (first, method), (second, _) = device.in_clean_worker(os.getpid), device.in_clean_worker(os.getpid)
        processes = list(device._kept[-1]._processes.values())
    assert first == second != os.getpid() and method == "clean worker (spawn)"
    assert not device._kept and len(processes) == 1
    processes[0].join(timeout=10)
    assert _gone(processes[0].pid)
    assert device.in_clean_worker(os.getpid)[0] not in (first, os.getpid())  # outside a block: a fresh one


def test_a_kept_worker_that_hangs_is_dropped_and_the_job_runs_here():
    with kept_worker():
        result, method = device.in_clean_worker(time.sleep, 3, timeout=1)
        assert result is None and method.startswith("in-process (the clean worker failed: TimeoutError")
        assert not device._kept  # the next job gets a fresh worker


@pytest.mark.slow
@pytest.mark.browser
def test_site_marks_mfu_above_100_as_suspect_and_flop_free_as_na(low_given_peak_run, tmp_path, browser):
    """Rows planted above 100 % MFU: the table, tooltip and totals show '⚠ 227%' with a title pointing to the
    warnings, the icicle keeps them out of its colour ramp; the ReLU and LayerNorm rows show n/a."""
    import polars as pl

    from cbsite.archive import Run
    from cbsite.generator import build_site
    from tests.helpers.browser import Server, recording_page

    src = low_given_peak_run
    fwd = pl.col("phase") == "forward"
    rows = src.rows.with_columns(
        pl.when(fwd & (pl.col("path") == "0")).then(2.27).when(fwd & (pl.col("path") == "")).then(1.5)
        .otherwise(pl.col("mfu")).alias("mfu"))
    meta = {**src.meta, "warnings": list(src.meta["warnings"]) + ["planted: 0 (forward) at 227 % MFU"]}
    Run(meta=meta, rows=rows, samples=src.samples).save(tmp_path / "runs")
    built = build_site(tmp_path / "runs", tmp_path / "site", quiet=True)
    server = Server(built)
    try:
        run_dir = next((built / "runs" / "model" / "v0").iterdir())
        with recording_page(browser, {"width": 1300, "height": 900}) as page:
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}runs/model/v0/{run_dir.name}/")
            page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
            cells = page.evaluate("""() => {
                const d = window.cbsiteRun.data, out = {};
                const col = Array.from(document.querySelectorAll('#cbsite-table thead th')).findIndex(th => th.textContent.startsWith('MFU'));
                document.querySelectorAll('#cbsite-table tbody tr').forEach(tr => {
                    const td = tr.children[col];
                    out[d.path[+tr.dataset.index]] = [td.textContent, td.className, td.title]; });
                return out; }""")
            text, cls, title = cells["0"]
            assert text == "\u26a0 227%" and "cbsite-suspect" in cls and "warnings" in title
            assert cells["1"][0] == cells["2"][0] == "n/a"  # ReLU, LayerNorm: no FLOPs, no MFU
            # The icicle colours by MFU: the suspect node is outside the ramp, whose top stays below 100 %.
            legend = page.inner_text("#cbsite-legend")
            assert "MFU above 100 %" in legend and "227%" not in legend
            index = page.evaluate("window.cbsiteRun.data.path.indexOf('0')")
            page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first.hover()
            tip = page.locator(".cbsite-tip").inner_text()
            assert "\u26a0 227%" in tip and "suspect" in tip
            totals = page.locator("table.cbsite-totals .cbsite-suspect", has_text="150%")  # the root's planted 150 %
            assert totals.count() == 1 and totals.inner_text() == "\u26a0 150%" and "warnings" in totals.get_attribute("title")
            assert page.locator("#warnings").count() == 1 and errors == []
    finally:
        server.close()


SMALL_SHAPES = [[64, 64, 64], [96, 96, 96], [128, 128, 128]]


@pytest.mark.skipif(device.free_cores() < 2, reason="an early calibration needs a core beside this process")
def test_a_calibration_started_early_is_taken_once_and_only_with_its_own_arguments():
    with kept_worker(start_now=True):
        assert device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES) == device.free_cores() - 1
        early = device.calibrate_cpu(torch.float32, 1, 0.005, shapes=SMALL_SHAPES)
        again = device.calibrate_cpu(torch.float32, 1, 0.005, shapes=SMALL_SHAPES)  # taken once: this one is its own
        device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES)
        other = device.calibrate_cpu(torch.float64, 1, 0.005, shapes=SMALL_SHAPES)  # not the one started
    detail = early["detail"]
    assert detail["started_early"] and detail["ran_beside_setup_s"] >= 0 and detail["waited_for_s"] >= 0
    assert detail["method"] == "clean worker (spawn)" and early["flops"] > 0 and early["bandwidth"] > 0
    assert "started_early" not in again["detail"] and "started_early" not in other["detail"]
    # The first pass times every shape, the later ones its two fastest; each says how long it waited for a CPU.
    first, *later = detail["repeats"]
    assert [r[:3] for r in first["rates"]] == SMALL_SHAPES and len(later) == device.CALIBRATION_REPEATS - 1
    fastest = [r[:3] for r in sorted(first["rates"], key=lambda r: -r[3])[:device.LATER_PASS_SHAPES]]
    assert all([r[:3] for r in p["rates"]] == fastest for p in later)
    assert all(p["waited_s"] >= 0 for p in detail["repeats"])
    assert early["flops"] == max(r[3] for p in detail["repeats"] for r in p["rates"])


@pytest.mark.skipif(device.free_cores() < 2, reason="an early calibration needs a core beside this process")
def test_a_start_calibration_handed_to_the_worker_as_it_started_is_taken_and_another_is_not():
    from cbsite.collector import clean_worker

    args = device.calibration_args("float32", 1, device.CALIBRATION_REPEATS, 0.005, SMALL_SHAPES)
    with kept_worker(first=(*device.CALIBRATION_JOB, args)):
        time.sleep(0.5)  # the caller's imports: the job has been under way since the worker started
        assert device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES) == device.free_cores() - 1
        assert not clean_worker._first  # taken
        taken = device.calibrate_cpu(torch.float32, 1, 0.005, shapes=SMALL_SHAPES)
    # Submitted as the worker started, not when the collection asked for it.
    assert taken["detail"]["started_early"] and taken["detail"]["ran_beside_setup_s"] >= 0.5
    assert len(taken["detail"]["repeats"]) == device.CALIBRATION_REPEATS and taken["flops"] > 0
    other = device.calibration_args("float64", 1, device.CALIBRATION_REPEATS, 0.005, SMALL_SHAPES)
    with kept_worker(first=(*device.CALIBRATION_JOB, other)):
        assert device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES) is not None
        assert not clean_worker._first  # looked at once, and not this collection's: its own was submitted
        own = device.calibrate_cpu(torch.float32, 1, 0.005, shapes=SMALL_SHAPES)
    assert own["detail"]["started_early"] and own["detail"]["ran_beside_setup_s"] < 0.5


def test_the_clis_first_job_is_the_start_calibration_a_collection_asks_for():
    """`cbsite collect` names the start calibration before torch is imported (cpu_plan.start_job); the collection then
    asks for it with its own config (collect.collect -> device.start_calibration). Equal arguments or it is not taken."""
    from cbsite.collector import cpu_plan
    from cbsite.collector.config import DTYPES, threads_for

    config = CollectConfig()
    job = cpu_plan.start_job(config.dtype, config.num_threads or cpu_plan.DEFAULT_CPU_THREADS)
    if device.free_cores() - threads_for(config) < 1:
        assert job is None
        return
    asked = device.calibration_args(str(DTYPES[config.dtype]).replace("torch.", ""), threads_for(config))
    assert job == (*device.CALIBRATION_JOB, asked)
    module, name = device.CALIBRATION_JOB
    assert getattr(__import__(module, fromlist=[name]), name) is device._calibrate_repeats


def test_a_calibration_is_not_started_early_without_a_kept_worker_or_a_core_to_spare(monkeypatch):
    assert device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES) is None  # no kept worker
    monkeypatch.setattr(device, "free_cores", lambda: 1)
    with kept_worker():
        assert device.start_calibration(torch.float32, 1, 0.005, SMALL_SHAPES) is None  # it would take this core
        assert not device._early


@pytest.mark.skipif(device.free_cores() < 2, reason="an early calibration needs a core beside this process")
def test_a_collection_calibrates_while_it_builds_the_model_and_the_build_leaves_it_a_core(tmp_path):
    from cbsite.collector.collect import collect
    from cbsite.collector.request import CollectRequest
    from tests import session_models

    session_models.BUILT_WITH_THREADS.clear()
    config = CollectConfig(min_run_time=0.005, warmup=1, progress=False, phases=("forward",), step=False, num_threads=1)
    before = torch.get_num_threads()
    run = collect(CollectRequest("tests.session_models:threads_seen", batches=1, config=config))
    start = run.meta["device"]["calibration"]["start"]
    assert start["started_early"] and start["method"] == "clean worker (spawn)"
    assert session_models.BUILT_WITH_THREADS == [device.free_cores() - 1]  # the calibration's core left to it
    assert torch.get_num_threads() == before  # and the caller's own setting back afterwards
    assert run.meta["device"]["peak_source"]["flops"].startswith("calibrated")
    assert run.meta["calibration"] == {"calibrated": True, "drift_checked": True, "skipped": None}


def test_the_clean_worker_starts_without_torch_in_the_caller():
    """`cbsite collect` starts its calibration worker before it imports torch (its interpreter and torch import run
    beside the command's own): the module that starts it must not import torch itself, nor must the packages above it."""
    code = ("import sys\nimport cbsite.cli\nfrom cbsite.collector import clean_worker\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
            "print('no torch')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "no torch" in out.stdout, out.stderr[-2000:]


def test_a_worker_whose_collection_is_killed_outright_ends_too(tmp_path):
    """SIGKILL (or the OOM killer) gives a collection no chance to stop its calibration worker; the worker sees its
    parent gone and ends, instead of waiting for jobs for ever with the caller's pipes open."""
    script = tmp_path / "killed.py"
    script.write_text(
        "import os\nfrom cbsite.collector import clean_worker\n"
        "with clean_worker.kept_worker(start_now=True):\n"
        "    print(clean_worker.in_clean_worker(os.getpid)[0], flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    from cbsite.collector import clean_worker

    # Its stdout is a pipe the worker inherited: a worker left running would keep this call waiting to its timeout.
    out = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, timeout=120)
    worker = int(out.stdout.split()[0])
    assert out.returncode == -9
    deadline = time.time() + 10 * clean_worker.WATCH_EVERY_S
    while time.time() < deadline and not _gone(worker):
        time.sleep(0.1)
    assert _gone(worker)


def _gone(pid: int) -> bool:
    """The process is gone, or a zombie not yet reaped (an executor's own thread may reap it and leave is_alive()
    unsure)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


@pytest.mark.parametrize("early", [True, False])
def test_a_drift_warning_says_when_the_start_copy_ran_beside_the_build(monkeypatch, early):
    """The start calibration's copy shares memory traffic with the model's build it runs beside: a lower start
    bandwidth is said to be possibly that, not only a change while timing."""
    start = {"flops": 1e11, "bandwidth": 3.0e10, "best_matmul_shape": [256, 256, 256]}
    if early:
        start.update(started_early=True, ran_beside_setup_s=2.5)
    info = {"dtype": "float32", "num_threads": 1, "peak_flops": {"float32": 1e11}, "peak_bandwidth": 3.0e10,
            "peak_source": {"flops": "calibrated", "bandwidth": "calibrated"},
            "calibration": {"num_threads": 1, "start": start}}

    def end(dtype, num_threads, *args, **kwargs):
        return {"flops": 1e11, "bandwidth": 3.6e10, "detail": {"method": "planted", "repeats": [], "seconds": 0.0}}

    monkeypatch.setattr(peaks, "calibrate_cpu", end)
    warnings: list[str] = []
    _, bandwidth = peaks._end_calibration(info, warnings)
    assert bandwidth == 3.6e10  # the higher is the peak either way
    [drift] = warnings
    assert drift.startswith("the calibrated copy bandwidth differed by 20%")
    assert ("ran beside the model's build (2.5 s)" in drift) is early
