"""Honest peaks: check, at the end of a collection, that no component beats the peak it is divided by.

`check_peaks` runs once after the ratios are derived:

1. **End calibration.** The CPU peak is calibrated again in a clean worker (`device.calibration.end`).
   When start and end differ by more than 10 % the run gets a warning; a calibrated peak becomes the
   higher of the two (a slower pass measured a busier machine, not a slower chip). A given or table
   peak is the user's word and is left as it is.
2. **Independent work.** A measured row whose achieved FLOP/s beats the peak is re-timed against work whose FLOPs
   are known apart from the row's own count: its dense matmul calls as its counting pass recorded them
   (counting.py: `mm`, `addmm`, `bmm`, `baddbmm`, whose FLOPs are 2*M*N*K from their shapes, no formula involved),
   and one square matmul of the run's dtype sized to the row's FLOPs per call. Each is timed standalone in a
   clean worker (best of repeats). A convolution or any other recorded call is not timed: its FLOPs come from the
   formula under test, and a miscount (grouped convolution backward, say) would only time its own error. Independent
   work faster than the peak raises the peak, with its source `calibrated (component shapes: <path>)` or
   `calibrated (dense matmul <n>^3 sized to <path>)`; nothing else can. The rows go fastest first, and no call is
   started once the budget is spent (`shapes_budget`: 2 % of the components' timed blocks, 1-5 s).
3. Every row's ratios are derived again from the peak used. A row whose FLOP/s is more than SUSPECT_FACTOR times
   the peak (itself the fastest independent work timed in this run) could not be reproduced: it is marked
   `FLOPS_SUSPECT_NOTE` and named in a run warning (its count is likely too high for the work done); a row above
   100 % MFU by less gets `MFU_NOTE` (timing noise). Bandwidth utilisation above 100 % is normal for a working set
   that stays in cache (the bandwidth peak is a DRAM copy): a note, never a peak change.

MFU above 100 % is thus never silent: either independent work raised the peak, with the reason in run.json's
`warnings` and `device.calibration`, or the row says it is suspect, and why.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils.benchmark import Timer

from cbsite import tree
from cbsite.collector.clean_worker import in_clean_worker
from cbsite.collector.counting import Counts, Signature, flop_counter
from cbsite.collector.cpu_plan import END_CALIBRATION_REPEATS
from cbsite.collector.device import calibrate_cpu
from cbsite.collector.random_values import normal_values

DRIFT_WARNING = 0.10  # start vs end calibration: a relative difference above this is reported
MAX_COMPONENTS = 24  # components re-calibrated on their shapes per run (the fastest first)
MAX_SIGNATURES = 64  # distinct op calls timed per run
SHAPE_REPEATS = 3
SHAPE_MIN_RUN_TIME = 0.05
LONG_CALL_BUDGET_S = 1.0  # a call longer than a block is timed again only while its calls add up to less
# The whole re-timing of shapes (`shapes_budget`): no call is started after it is spent (the rows come fastest first, so
# the shapes most likely to raise the peak are timed first): a start calibration on a slow moment leaves many rows
# above the peak, and a language model's large matmuls take seconds a call.
SHAPES_BUDGET_S = 5.0  # at most: one more component's measurement, as the per-component cap bounds one
SHAPES_BUDGET_SHARE = 0.02  # of the components' time in timed blocks
SHAPES_MIN_BUDGET_S = 1.0  # at least: a few shapes of a small model (each is timed three times, 0.05 s or one call)


def shapes_budget(timed_s: float) -> float:
    """Seconds the re-timing of shapes may start calls in: SHAPES_BUDGET_SHARE of the components' timed blocks
    (`timed_s`), within SHAPES_MIN_BUDGET_S and SHAPES_BUDGET_S, so that it stays a small part of the collection's
    untimed work whatever the model's size."""
    return min(SHAPES_BUDGET_S, max(SHAPES_MIN_BUDGET_S, SHAPES_BUDGET_SHARE * timed_s))

MFU_NOTE = "MFU above 100 %"
# A row above the peak by more than this factor, with no independent work as fast, is a counting suspect, not noise:
# a quiet machine's timing noise is about 10 %, and a miscount is large (a depthwise convolution's backward, 65x).
SUSPECT_FACTOR = 1.25
FLOPS_SUSPECT_NOTE = "FLOPs suspect"
REFERENCE_N = (32, 1024)  # a reference matmul's side: 1024^3 is the calibration's largest square, 2.1 GFLOP a call
BANDWIDTH_NOTE = (
    "bandwidth utilisation above 100 %: suspect; bytes moved is an estimate (every op's inputs and outputs, no "
    "cache), so reads served from a cache, or bytes counted on every rank of a sharded run, exceed the DRAM copy "
    "peak; the latency stands"
)

# A measured row's (path, phase) -> its counting pass (the calls it recorded), or None.
RecordedCalls = Callable[[str, str], Counts | None]


def _gflops(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate / 1e9:.3g} GFLOP/s"


def _gbps(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate / 1e9:.3g} GB/s"


def _label(row: dict[str, Any]) -> str:
    return f"{row['path'] or '<root>'} ({row['phase']})"


# ----- timing the calls standalone (in a clean worker) ---------------------------------------------


def _build(spec: Any, meta: bool = False) -> Any:
    """A recorded argument rebuilt: tensors of its shape, strides and dtype (on the meta device with `meta`: no memory,
    for counting FLOPs), sequences of them, or the value itself."""
    kind = spec[0]
    if kind == "tensor":
        _, shape, stride, dtype_name, device = spec
        dtype = getattr(torch, dtype_name)
        if meta:
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        size = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0) if all(s > 0 for s in shape) else 0
        if dtype.is_floating_point or dtype.is_complex:
            base = normal_values((max(size, 1),), dtype, device)
        else:
            base = torch.zeros(max(size, 1), dtype=dtype, device=device)
        return base.as_strided(shape, stride)
    if kind == "seq":
        items = [_build(s, meta) for s in spec[2]]
        return items if spec[1] == "list" else tuple(items)
    return spec[1]


def signature_flops(signatures: list[Signature]) -> list[int | None]:
    """Each call's FLOPs, counted on meta tensors in the collecting process, where FlopCounterMode has been used by
    the counting passes. Its first use in a process is slow (seconds), and the clean worker that times the calls would
    pay it on every run, far more than the timed repeats of a shape (0.05 s each)."""
    out: list[int | None] = []
    for name, arg_specs, kwarg_specs in signatures:
        try:
            op = _op(name)
            with flop_counter() as counter:  # cbsite's formulas, as the rows were counted
                op(*[_build(s, meta=True) for s in arg_specs], **{k: _build(s, meta=True) for k, s in kwarg_specs})
            out.append(int(counter.get_total_flops()))
        except Exception:  # noqa: BLE001 - no meta kernel: the worker counts this one on its real call
            out.append(None)
    return out


def _op(name: str) -> Any:
    namespace, rest = name.split("::", 1)
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _one_call(op: Any, args: list[Any], kwargs: dict[str, Any]) -> float:
    """Seconds of one call, the device synchronised on both sides."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    sync()
    started = time.perf_counter()
    op(*args, **kwargs)
    sync()
    return time.perf_counter() - started


def time_signatures(signatures: list[Signature], num_threads: int, repeats: int, min_run_time: float,
                    budget_s: float | None = None, flops: list[int | None] | None = None) -> list[dict[str, Any]]:
    """Time each call standalone (best of `repeats` medians); the worker's job. `flops`: each call's, counted by the
    caller (`signature_flops`); a call without them is counted here on its warm-up call. Once `budget_s` is spent, the
    calls left are not started (reported as not timed)."""
    torch.set_num_threads(num_threads)
    out: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i, (name, arg_specs, kwarg_specs) in enumerate(signatures):
        if budget_s is not None and time.perf_counter() - started >= budget_s:
            out.append({"flops": None, "seconds": None, "error": f"not timed: the re-timing's budget of {budget_s:g} s was spent"})
            continue
        try:
            op = _op(name)
            args = [_build(s) for s in arg_specs]
            kwargs = {k: _build(s) for k, s in kwarg_specs}
            counted = flops[i] if flops is not None else None
            if counted is None:
                with flop_counter() as counter:  # cbsite's formulas, as the rows were counted
                    op(*args, **kwargs)  # also the warm-up call
                counted = counter.get_total_flops()
            else:
                op(*args, **kwargs)  # the warm-up call
            first = _one_call(op, args, kwargs)
            if first >= min_run_time:
                # A call longer than a whole block is its own block: timed call by call, best of at most
                # `repeats` within LONG_CALL_BUDGET_S (blocked_autorange would run each repeat twice, and a language
                # model's head takes seconds a call).
                medians = [first]
                while len(medians) < repeats and sum(medians) < LONG_CALL_BUDGET_S:
                    medians.append(_one_call(op, args, kwargs))
            else:
                timer = Timer("op(*args, **kwargs)", globals={"op": op, "args": args, "kwargs": kwargs}, num_threads=num_threads)
                medians = [timer.blocked_autorange(min_run_time=min_run_time).median for _ in range(repeats)]
            out.append({"flops": int(counted), "seconds": min(medians), "repeats_s": medians})
        except Exception as exc:  # noqa: BLE001 - an op we cannot rebuild is reported, never fatal
            out.append({"flops": None, "seconds": None, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return out


def _describe(sig: Signature) -> str:
    def shape(spec: Any) -> str:
        if spec[0] == "tensor":
            return "x".join(map(str, spec[1])) or "scalar"
        return ""

    shapes = [shape(s) for s in sig[1] if s[0] == "tensor"]
    return f"{sig[0].split('::')[-1]}({', '.join(shapes)})"


# ----- the check ---------------------------------------------------------------------------------


def _rederive(rows: Iterable[dict[str, Any]], peak_flops: float | None, peak_bw: float | None) -> None:
    """Ratios of every row from its additive metrics (estimated containers hold their sums already)."""
    for row in rows:
        tree.derive_ratios(row, peak_flops, peak_bw)


def _achieved(row: dict[str, Any]) -> float | None:
    return row["tflops_per_s"] * 1e12 if row.get("tflops_per_s") is not None else None


def _named(rows: list[dict[str, Any]], mfu_format: str, shown: int = 12) -> str:
    """The first rows by label and MFU, and how many more there are, for a run warning."""
    named = ", ".join(f"{_label(r)} {mfu_format.format(r['mfu'])}" for r in rows[:shown])
    return named + (f" and {len(rows) - shown} more" if len(rows) > shown else "")


def _over_bandwidth(rows: Sequence[dict[str, Any]], peak_bw: float | None) -> list[str]:
    """Rows above the bandwidth peak: each gets BANDWIDTH_NOTE, and the run one warning naming them (as MFU has)."""
    over = [row for row in rows if row.get("bandwidth_util") is not None and row["bandwidth_util"] > 1]
    for row in over:
        _add_note(row, BANDWIDTH_NOTE)
    if not over:
        return []
    shown = ", ".join(f"{_label(r)} {r['bandwidth_util']:.0%}" for r in over[:12])
    more = f" and {len(over) - 12} more" if len(over) > 12 else ""
    peak = f" of {peak_bw / 1e9:.3g} GB/s" if peak_bw else ""
    return [f"{len(over)} row(s) move more than the peak bandwidth{peak}: {shown}{more}; bytes moved is an estimate "
            "(every op's inputs and outputs, no cache), so reads served from a cache, or bytes counted on every rank "
            "of a sharded run, exceed the peak: their bandwidth and bound are suspect, their latency stands"]


def _add_note(row: dict[str, Any], note: str) -> None:
    notes = list(row.get("notes") or [])
    if note not in notes:
        notes.append(note)
    row["notes"] = notes


def _end_calibration(device_info: dict[str, Any], warnings: list[str]) -> tuple[float | None, float | None]:
    """Calibrate again (clean worker); a calibrated peak becomes the higher of start and end."""
    cal = device_info["calibration"]
    start = cal["start"]
    dtype = getattr(torch, device_info.get("dtype") or "float32")
    # The start's best shape only: the end measures drift on the same work, and the peak is already the best over
    # every shape (the other four shapes were two thirds of a calibration's time).
    best = start.get("best_matmul_shape")
    only_best: dict[str, Any] = {"shapes": [best]} if best else {}
    end = calibrate_cpu(dtype, int(cal.get("num_threads") or device_info.get("num_threads") or torch.get_num_threads()),
                        repeats=END_CALIBRATION_REPEATS, **only_best)
    cal["end"] = {"flops": end["flops"], "bandwidth": end["bandwidth"], **end["detail"]}
    source = device_info.setdefault("peak_source", {"flops": None, "bandwidth": None})
    dtype_name = device_info.get("dtype") or "float32"
    peak = (device_info.get("peak_flops") or {}).get(dtype_name)
    peak_bw = device_info.get("peak_bandwidth")
    used = cal.setdefault("used", {})
    for key, what, fmt in (("flops", "matmul FLOP/s", _gflops), ("bandwidth", "copy bandwidth", _gbps)):
        a, b = start.get(key), end[key]
        if a and b and abs(b - a) / min(a, b) > DRIFT_WARNING:
            # A start calibration that ran beside the model's build (device.start_calibration) shared the machine's
            # memory with it: a lower start copy may be that, not a change while timing.
            beside = (f"; the start calibration ran beside the model's build ({start['ran_beside_setup_s']:.1f} s), "
                      "whose memory traffic a copy shares, so a lower start may be that"
                      if key == "bandwidth" and b > a and start.get("started_early") else "")
            warnings.append(
                f"the calibrated {what} differed by {abs(b - a) / min(a, b):.0%} between the start ({fmt(a)}) and the "
                f"end ({fmt(b)}) of the run: the machine's speed varied while timing (load, frequency); "
                f"the higher is the peak, and latencies may carry the same variation{beside}"
            )
        if source.get(key) != "calibrated":
            used[key] = source.get(key)
            continue
        used[key] = "end" if b and a and b > a else "start"
        if key == "flops" and b and (peak is None or b > peak):
            peak = b
        if key == "bandwidth" and b and (peak_bw is None or b > peak_bw):
            peak_bw = b
    for when in ("start", "end"):
        method = cal[when].get("method", "")
        if method.startswith("in-process"):
            warnings.append(f"the {when} calibration ran {method}: the peak may be low if this process was busy")
    return peak, peak_bw


def dense_matmul_flops(sig: Signature) -> int | None:
    """A recorded call's FLOPs from its shapes alone, where it is a dense matmul (`mm`, `addmm`, `bmm`, `baddbmm`):
    2*M*N*K (times the batch), the definition every counter shares. None for any other op, whose count would come
    from the formula a peak check must not trust (a convolution's, say)."""
    name, args, _ = sig
    op = name.split("::")[-1].split(".")[0]
    first = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1}.get(op)
    if first is None or len(args) < first + 2:
        return None
    a, b = args[first], args[first + 1]
    if a[0] != "tensor" or b[0] != "tensor":
        return None
    (sa, sb), rank = (a[1], b[1]), 3 if op.startswith("b") else 2
    if len(sa) != rank or len(sb) != rank or sa[-1] != sb[-2]:
        return None
    batch = sa[0] if rank == 3 else 1
    return 2 * batch * sa[-2] * sa[-1] * sb[-1]


def reference_matmul(flops_per_call: float, dtype_name: str, device: str) -> Signature:
    """A square `mm` of the run's dtype whose FLOPs (2*n^3) are about `flops_per_call`: the same work as a row would
    claim, with a count nobody can get wrong (n within REFERENCE_N, a multiple of 8)."""
    n = round((max(flops_per_call, 1.0) / 2) ** (1 / 3) / 8) * 8
    n = min(max(n, REFERENCE_N[0]), REFERENCE_N[1])
    operand = ("tensor", (n, n), (n, 1), dtype_name, device)
    return ("aten::mm", (operand, operand), ())


def _component_ceilings(
    above: list[dict[str, Any]],
    recorded: RecordedCalls,
    num_threads: int,
    budget_s: float,
    dtype_name: str,
    device: str,
) -> tuple[list[dict[str, Any]], str | None]:
    """Each row's independent work (its dense matmul calls, and a reference matmul sized to its FLOPs per call), the
    distinct calls timed in one clean worker; per row the rate of its own dense calls and of its reference."""
    records: list[dict[str, Any]] = []
    unique: dict[Signature, int] = {}

    def want(sig: Signature) -> None:
        if sig not in unique and len(unique) < MAX_SIGNATURES:
            unique[sig] = len(unique)

    for row in above[:MAX_COMPONENTS]:
        rec: dict[str, Any] = {"path": row["path"], "phase": row["phase"], "achieved_flops_per_s": _achieved(row)}
        counts = recorded(row["path"], row["phase"])
        if counts is None:
            rec["error"] = "no counting pass recorded for this component"
        else:
            dense = {sig: n for sig, n in counts.matmul_calls.items() if dense_matmul_flops(sig) is not None}
            rec["calls"] = dense
            others = sorted({_describe(sig) for sig in counts.matmul_calls if sig not in dense})
            if others:  # their FLOPs are the formula's word: never timed to raise a peak
                rec["not_independent"] = others
            if counts.undescribed_matmuls:
                rec["undescribed_ops"] = counts.undescribed_matmuls
            # The row's count is checked where all of it is dense matmul work whose FLOPs its shapes give (the calls
            # are a whole batch's, the count per call: measure.per_call's integer division).
            analytic = sum(n * (dense_matmul_flops(sig) or 0) for sig, n in dense.items())
            calls = max(int(row.get("call_count") or 1), 1)
            rec["count_verified"] = bool(counts.flops) and abs(analytic - counts.flops * calls) < calls
            for sig in dense:
                want(sig)
        rec["reference"] = reference_matmul(float(row["flops"] or 0), dtype_name, device)
        want(rec["reference"])
        records.append(rec)
    method = None
    timings: list[dict[str, Any]] = []
    if unique:
        sigs = list(unique)
        timings, method = in_clean_worker(time_signatures, sigs, num_threads, SHAPE_REPEATS, SHAPE_MIN_RUN_TIME,
                                          budget_s, [dense_matmul_flops(s) for s in sigs])
    skipped: dict[str, Any] = {"flops": None, "seconds": None, "error": "not timed (cap)"}
    for rec in records:
        reference = rec.pop("reference")
        t = timings[unique[reference]] if reference in unique else skipped
        rec["reference"] = {"op": _describe(reference), **t}
        if t.get("flops") and t.get("seconds"):
            rec["reference"]["flops_per_s"] = t["flops"] / t["seconds"]
        calls = rec.pop("calls", None)
        if calls is None:
            continue
        ops: dict[Signature, dict[str, Any]] = {}
        flops = seconds = 0.0
        complete = True
        for sig, n in calls.items():
            t = timings[unique[sig]] if sig in unique else skipped
            ops[sig] = {"op": _describe(sig), "calls": n, **t}
            if t.get("flops") is None or not t.get("seconds"):
                complete = False
                continue
            flops += n * t["flops"]
            seconds += n * t["seconds"]
        rec["ops"] = list(ops.values())
        if not calls:
            rec["error"] = "no dense matmul call whose FLOPs its shapes give"
        elif flops and seconds:
            rec["ceiling_flops_per_s"] = flops / seconds
            if not complete:
                rec["partial"] = True
    return records, method


def _raiser(records: list[dict[str, Any]]) -> tuple[float, str, str] | None:
    """The fastest independent work timed: (FLOP/s, peak source, what it was), or None."""
    best: tuple[float, str, str] | None = None
    for rec in records:
        where = rec["path"] or "<root>"
        own = rec.get("ceiling_flops_per_s")
        if own and (best is None or own > best[0]):
            best = (own, f"calibrated (component shapes: {where})", f"{where} ({rec['phase']})'s own matmul calls")
        ref = rec.get("reference") or {}
        rate = ref.get("flops_per_s")
        if rate and (best is None or rate > best[0]):
            n = ref["op"].split("(")[1].split("x")[0]
            best = (rate, f"calibrated (dense matmul {n}^3 sized to {where})",
                    f"a dense {n}x{n}x{n} matmul sized to {where} ({rec['phase']})")
    return best


def check_peaks(
    rows: Sequence[dict[str, Any]],
    device_info: dict[str, Any],
    recorded: RecordedCalls,
    shapes_budget_s: float = SHAPES_BUDGET_S,
) -> list[str]:
    """Check the run's peaks against its rows; fix what can be fixed; return warnings for run.json.
    `shapes_budget_s`: what the re-timing of independent work may take (`shapes_budget`).

    Mutates `rows` (ratios, notes) and `device_info` (peak_flops, peak_bandwidth, peak_source,
    calibration) in place. `recorded(path, phase)` returns the counts of that component's phase, whose
    dense `matmul_calls` are timed as its own independent work (or None).
    """
    started = time.perf_counter()
    warnings: list[str] = []
    dtype_name = device_info.get("dtype") or "float32"
    peak_flops = (device_info.get("peak_flops") or {}).get(dtype_name)
    peak_bw = device_info.get("peak_bandwidth")
    source = device_info.setdefault("peak_source", {"flops": None, "bandwidth": None})
    cal = device_info.get("calibration")
    if isinstance(cal, dict) and isinstance(cal.get("start"), dict):
        peak_flops, peak_bw = _end_calibration(device_info, warnings)
    num_threads = int(device_info.get("num_threads") or torch.get_num_threads())

    _rederive(rows, peak_flops, peak_bw)
    above = sorted(
        (r for r in rows if r["status"] == "measured" and r.get("mfu") is not None and r["mfu"] > 1),
        key=lambda r: -(_achieved(r) or 0.0),
    )
    verified: set[tuple[str, str]] = set()  # rows whose whole count is dense matmuls' 2*M*N*K
    if above and peak_flops:
        before, before_source = peak_flops, source.get("flops")
        device = "cuda" if device_info.get("kind") == "cuda" else "cpu"
        records, method = _component_ceilings(above, recorded, num_threads, shapes_budget_s, dtype_name, device)
        verified = {(r["path"], r["phase"]) for r in records if r.get("count_verified")}
        best = _raiser(records)
        raised = best is not None and best[0] > peak_flops
        if raised and best is not None:
            peak_flops, source["flops"] = best[0], best[1]
        if not isinstance(cal, dict):
            cal = device_info["calibration"] = {}
        cal["component_shapes"] = {"method": method, "peak_before": before, "source_before": before_source,
                                   "budget_s": round(shapes_budget_s, 3), "components": records}
        named = ", ".join(f"{_label(r)} at {_gflops(_achieved(r))}" for r in above[:8])
        more = f" and {len(above) - 8} more" if len(above) > 8 else ""
        head = (f"{len(above)} row(s) beat the peak of {_gflops(before)} ({before_source}): {named}{more}; "
                "re-timed against work whose FLOPs their shapes give (dense matmuls, in a clean worker)")
        if raised and best is not None:
            warnings.append(f"{head}: {best[2]} ran at {_gflops(peak_flops)} standalone, "
                            f"so the peak was raised to {_gflops(peak_flops)} and every MFU derived from it")
        else:
            why = (f"the fastest, {best[2]}, ran at {_gflops(best[0])}, not above the peak" if best is not None
                   else "none of it could be timed")
            warnings.append(f"{head}: {why}, so the peak was kept")
        _rederive(rows, peak_flops, peak_bw)

    still = [r for r in rows if r.get("mfu") is not None and r["mfu"] > 1]
    suspect = [r for r in still if r["mfu"] > SUSPECT_FACTOR and (r["path"], r["phase"]) not in verified]
    suspect_ids = {id(r) for r in suspect}
    noisy = [r for r in still if id(r) not in suspect_ids]
    for row in suspect:
        _add_note(
            row,
            f"{FLOPS_SUSPECT_NOTE}: {_gflops(_achieved(row))} counted, {row['mfu']:.1f}x the peak of "
            f"{_gflops(peak_flops)} ({source.get('flops')}), and no dense matmul of known FLOPs ran that fast; the FLOP "
            "count is likely too high for the work done, so its MFU is not a utilisation; see run warnings",
        )
    if suspect:
        warnings.append(
            f"{FLOPS_SUSPECT_NOTE} for {len(suspect)} row(s): {_named(suspect, '{:.1f}x')} the peak of {_gflops(peak_flops)}; no "
            "work whose FLOPs are known apart from their count (dense matmuls of their size, their own matmul calls) "
            "ran that fast, so their FLOP count is likely too high (a formula that overcounts, e.g. grouped "
            "convolution backward), the peak was not raised by them, and their MFU is suspect"
        )
    for row in noisy:
        _add_note(
            row,
            f"{MFU_NOTE}: {_gflops(_achieved(row))} achieved against a peak of {_gflops(peak_flops)} "
            "(timing noise, or FLOPs this device runs faster than any calibration); see run warnings",
        )
    if noisy:
        warnings.append(
            f"MFU above 100 % remains for {len(noisy)} row(s) after re-calibration: {_named(noisy, '{:.0%}')}; "
            "read their MFU as suspect (the site marks it)"
        )
    warnings.extend(_over_bandwidth(rows, peak_bw))

    if peak_flops:
        device_info["peak_flops"] = {dtype_name: peak_flops}
    device_info["peak_bandwidth"] = peak_bw
    if isinstance(cal, dict):
        cal["check_s"] = round(time.perf_counter() - started, 3)
    return warnings
