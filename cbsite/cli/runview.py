"""One run as the terminal shows it (`collect`, `show`): a header line, memory, warnings, step throughput and the
components that cost the most time. Numbers go through cbsite.format, so they read as on the site."""

from __future__ import annotations

from typing import Any

from cbsite import format as fmt
from cbsite.cli.common import console as make_console

# The collection's stages in the order they run (run.json `breakdown_s`); only `-v` prints them.
STAGES = ("preserve_model", "setup_and_capture", "calibration_start", "components", "components_timed_blocks",
          "components_plugins", "components_capture", "components_quiet_waits", "components_counting",
          "components_memory_peaks", "components_backward_graphs", "components_warm_up", "components_block_sizing",
          "components_other", "hierarchy_remeasure", "hierarchy_remeasure_timed_blocks", "rounds",
          "calibration_end_and_peak_checks", "step")


def header(meta: dict[str, Any]) -> str:
    """What follows model@version on the first line: run id, device, dtype, peak, wall time, the counts."""
    dev = meta["device"]
    peaks = dev.get("peak_flops")
    peak = next(iter(peaks.values()), None) if isinstance(peaks, dict) and peaks else None
    source = dev.get("peak_source")
    source = source.get("flops") if isinstance(source, dict) else source
    return (f"  {meta['run_id']}  {dev.get('name')} ({dev.get('kind')}, "
            f"{dev.get('num_threads')} threads)  dtype {meta['dtype']}  peak {fmt.si(peak, 'FLOP/s')} ({source})  "
            f"wall {wall_time(meta.get('wall_time_s'))}  components {fmt.counts(meta)}")


def wall_time(seconds: float | None) -> str:
    """Wall seconds as the site writes durations ("70 s", "950 ms")."""
    return fmt.fmt_time(seconds * 1000) if fmt.finite(seconds) else fmt.DASH


def stage_times(meta: dict[str, Any]) -> str | None:
    """The `time:` line: seconds per stage of the collection, in the order they ran."""
    breakdown = meta.get("breakdown_s")
    if not isinstance(breakdown, dict) or not breakdown:
        return None
    keys = [k for k in STAGES if k in breakdown] + sorted(k for k in breakdown if k not in STAGES)
    parts = ", ".join(f"{k.replace('_', ' ')} {breakdown[k]:.1f}s" for k in keys if isinstance(breakdown[k], (int, float)))
    return f"time: {parts}"


def memory_line(mem: Any) -> str | None:
    """Peak, limit and capture plan of the collection's memory, and where the peak was reached."""
    if not isinstance(mem, dict) or not mem:
        return None

    size = fmt.fmt_bytes
    peak = mem.get("peak_rss_bytes") if mem.get("peak_rss_bytes") is not None else mem.get("peak_device_bytes")
    oom = mem.get("out_of_memory") or []
    setter = mem.get("peak_set_by")
    returned = mem.get("heap_returned")
    anchored = mem.get("capture_anchors")
    return (
        f"memory: peak {size(peak)}, limit {size(mem.get('limit_bytes'))} ({mem.get('limit_source')}), "
        f"{mem.get('capture_groups')} capture group(s) in {mem.get('capture_forwards')} forwards"
        + (f" and {anchored['batches']} replay(s) of their anchors"
           if isinstance(anchored, dict) and anchored.get("batches") else "")
        + (" (the first group's batch 0 taken in the whole model's peak pass)" if mem.get("capture_rode_root") else "")
        + ((f"; peak reached in stage {str(setter.get('stage')).replace('_', ' ')}" if setter.get("what") == "stage"
            else f"; peak reached in the {setter.get('what')} of {setter.get('path') or '<root>'}")
           if isinstance(setter, dict) and setter.get("peak_bytes") == peak else "")
        + (f"; freed heap handed back after {returned['times']} measurement(s), {size(returned.get('bytes'))}"
           if isinstance(returned, dict) and returned.get("times") else "")
        + (f"; out of memory: {len(oom)} component phase(s)" if oom else ""))


def print_run(run: Any, top: int = 15, verbosity: int = 0) -> None:
    """Summary and the components that cost the most forward+backward time, as a terminal table."""
    from rich.markup import escape
    from rich.table import Table

    from cbsite.runsummary import top_components  # polars: not on the import path of the parser (completion)
    from cbsite.throughput import step_lines

    meta = run.meta
    out = make_console()
    # Everything from the archive is printed as text, never read as rich markup.
    out.print(f"[bold]{escape(meta['model'])}@{escape(meta['version'])}[/bold]" + escape(header(meta)), highlight=False)
    lines = [stage_times(meta) if verbosity > 0 else None, memory_line(meta.get("memory"))]
    for line in lines:
        if line:
            out.print(line, markup=False, highlight=False)
    warnings = meta.get("warnings")
    for warning in warnings if isinstance(warnings, list) else []:
        out.print(f"[yellow]warning:[/yellow] {escape(str(warning))}")
    for line in step_lines(meta):
        out.print(line, markup=False, highlight=False)
    table = Table("component", "type", "status", "calls", "fwd", "bwd", "FLOP fwd", "MFU fwd", "BW util fwd", "params")
    for r in top_components(run, top):
        table.add_row(
            escape("  " * (r["depth"] - 1) + r["path"]), escape(r["module_type"].rsplit(".", 1)[-1]), r["status"],
            str(r["call_count"]), fmt.fmt_time(r.get("latency_ms_forward")), fmt.fmt_time(r.get("latency_ms_backward")),
            fmt.si(r.get("flops_forward"), "FLOP"), fmt.fmt_pct(r.get("mfu_forward")),
            fmt.fmt_pct(r.get("bandwidth_util_forward")), fmt.si(r["param_bytes"], "B"),
        )
    out.print(table)


def run_json(run: Any, top: int) -> dict[str, Any]:
    """`show --format json`: the run's metadata and its top components with their raw figures."""
    from cbsite.runsummary import top_components

    return fmt.json_safe({"run": run.meta, "path": str(run.path) if run.path else None,
                          "top_components": top_components(run, top)})
