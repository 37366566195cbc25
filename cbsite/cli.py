"""The command line: verbs over the archive. `CbsiteError` is caught here, once, and printed as one line.

collect  profile a model into the archive        ls       list runs
show     print one run                            diff     compare two runs
build    build the site from the archive          serve    serve a built or published site
publish  publish a site version (mike layout)     export   write a run as CSV / Parquet / JSON
demo     collect the demo models and build the site  gc       remove what killed runs left in the archive
sweep    one run per point of a grid of options (a study)
upgrade  rewrite older runs at the current schema
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from cbsite.errors import CbsiteError
from cbsite.format import counts as counts_text

DEFAULT_RUNS = Path(os.environ.get("CBSITE_RUNS", "runs"))

# The demo: two versions of DLRM that differ the way model revisions do (a wider over arch and a bigger
# embedding dim), plus DeepFM and nanoGPT, on CPU-friendly sizes.
DEMO = (
    ("dlrm", "dlrm", "v1", {}),
    ("dlrm", "dlrm", "v2", {"embedding_dim": 64, "over_arch_layer_sizes": [256, 128, 1]}),
    ("deepfm", "deepfm", "v1", {}),
    ("nanogpt", "nanogpt", "v1", {}),
)
# The demo's small study (a `cbsite sweep`, runs/demo-dense-sparse and runs/_studies): provider, study name, shared
# options, axes; collected without plugins, to depth 2, on a small budget: half a MB, minutes at most on 2 cores.
DEMO_STUDY = ("dlrm-synthetic", "demo-dense-sparse", {"size": "tiny"}, ("dense_features=64,512", "sparse_features=4,16"))
DEMO_STUDY_CONFIG = {"plugins": (), "plugin_options": {}, "max_depth": 2, "min_run_time": 0.05, "progress": False}


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are read as JSON when they parse (numbers, lists), else as strings."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise CbsiteError(f"option {pair!r} is not key=value; e.g. -o embedding_dim=32 -o 'over_arch_layer_sizes=[64,1]'")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _add_collect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="archive folder (default: runs)")
    p.add_argument("--max-depth", type=int, default=None, help="deepest component level to measure")
    p.add_argument("--include", action="append", default=[], help="glob on path or module type; repeatable")
    p.add_argument("--exclude", action="append", default=[], help="glob on path or module type; repeatable")
    p.add_argument("--phases", default="forward,backward", help="forward,backward (default both)")
    p.add_argument("--budget", type=float, default=0.1, help="seconds of timed runs per component and phase")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--peak-flops", type=float, default=None, help="override the peak FLOP/s used for MFU")
    p.add_argument("--peak-bandwidth", type=float, default=None, help="override the peak bytes/s")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default on CPU: 1, measured as the honest choice on shared machines; manual: Latency verdicts)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the timing in this many processes (the collecting one, then fresh workers) so the "
                        "run carries its run-to-run noise; gates judge latency only with 2 or more")
    p.add_argument("--max-component-s", type=float, default=None,
                   help="wall seconds one component and phase may spend in timing (default: 20x --budget, at least 5)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="most memory the collecting process may hold on CPU, e.g. 20GB (default: 90%% of what is "
                        "available at the start); a component that needs more fails as 'out of memory', its "
                        "children are measured and it is estimated from them")
    p.add_argument("--no-step", action="store_true",
                   help="skip the whole model's training step and eval forward (step throughput in run.json)")
    p.add_argument("--count-every-twin", action="store_true",
                   help="count FLOPs, bytes and peak memory of every component, also of twins (identical modules on "
                        "inputs of the same shapes, e.g. GPT-2's 12 blocks), which by default take the first one's counts")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--plugin", action="append", default=[],
                   help="profiler/preprocessor/reporter plugin by name, e.g. trace, ops, log, compile; repeatable "
                        "(replaces the list of [tool.cbsite] in pyproject.toml or cbsite.toml)")
    p.add_argument("--plugin-option", action="append", default=[], metavar="PLUGIN.KEY=VALUE",
                   help="plugin option, e.g. compile.mode=max-autotune; repeatable")


def _plugin_selection(args: argparse.Namespace, default: Sequence[str] = (),
                      default_options: dict[str, dict[str, Any]] | None = None) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    """Plugins and options from the configuration file found from the working directory, then the CLI."""
    from cbsite.collector.plugins.registry import merged_selection, parse_option_pairs

    cli_options = parse_option_pairs(args.plugin_option, _parse_value)
    names, options, _ = merged_selection(args.plugin or list(default), cli_options, Path.cwd())
    if not args.plugin and default:  # the demo's defaults: file options apply only to plugins it selects
        options = {k: v for k, v in options.items() if k in names}
        for name, values in (default_options or {}).items():
            options[name] = {**values, **options.get(name, {})}
    return tuple(names), options


def _parse_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _collect_config(args: argparse.Namespace, plugins: tuple[tuple[str, ...], dict[str, dict[str, Any]]] | None = None):
    from cbsite.collector import CollectConfig
    from cbsite.collector.memory import parse_size

    names, options = plugins if plugins is not None else _plugin_selection(args)
    return CollectConfig(
        plugins=names,
        plugin_options=options,
        max_depth=args.max_depth,
        include=tuple(args.include),
        exclude=tuple(args.exclude),
        phases=tuple(p.strip() for p in args.phases.split(",") if p.strip()),
        min_run_time=args.budget,
        device=args.device,
        dtype=args.dtype,
        peak_flops=args.peak_flops,
        peak_bandwidth=args.peak_bandwidth,
        num_threads=args.threads,
        step=not args.no_step,
        count_twins_once=not getattr(args, "count_every_twin", False),
        rounds=args.rounds,
        max_component_s=args.max_component_s,
        memory_limit=None if getattr(args, "memory_limit", None) is None else parse_size(args.memory_limit),
        progress=not args.no_progress,  # a bar on a terminal, occasional lines in a log (profiler._progress)
    )


def cmd_collect(args: argparse.Namespace) -> int:
    # No torch in either: the worker starts before torch is imported here.
    from cbsite.collector.clean_worker import kept_worker
    from cbsite.collector.cpu_plan import DEFAULT_CPU_THREADS, start_job

    if args.distributed:
        return _collect_distributed(args, _collect_request(args))
    # A CPU collection calibrates in a clean worker: started now, with its start calibration as its first job, so that
    # its interpreter, its torch import and the calibration run beside this process's imports and the model's build,
    # and the collection waits for less of it (device.start_calibration takes that job).
    first = start_job(args.dtype, args.threads or DEFAULT_CPU_THREADS) if args.device == "cpu" else None
    with kept_worker(start_now=True, first=first) if args.device == "cpu" else contextlib.nullcontext():
        from cbsite.collector.collect import collect

        _note_stale(args.runs)
        with _staging_in(args.runs):
            run = collect(_collect_request(args))
    # Saved once the worker is gone: a collection killed while saving leaves no process of its own behind (an
    # orphaned worker held the caller's pipes open).
    path = run.save(args.runs)
    _print_run(run, top=args.top)
    print(f"saved {path}")
    return 0


def _collect_request(args: argparse.Namespace) -> Any:
    """The CollectRequest of `cbsite collect`'s arguments."""
    from cbsite.collector.collect import CollectRequest, Preprocessing
    from cbsite.provenance import git_state

    version = args.version
    if version == "auto":
        git = git_state()
        if git is None:
            raise CbsiteError("--version auto needs a git work tree here; give a version name instead")
        version = git["short"] + ("-dirty" if git["dirty"] else "")
    return CollectRequest(
        provider=args.provider,
        options=_parse_options(args.option),
        model_name=args.model,
        version=version,
        batches=args.batches,
        seed=args.seed,
        preprocessing=Preprocessing(args.shrink_factor, args.shrink_cap, args.batch_size),
        config=_collect_config(args),
        tags=tuple(args.tag),
        notes=args.notes,
    )


def _collect_distributed(args: argparse.Namespace, request: Any) -> int:
    """One rank of `torchrun ... -m cbsite collect ... --distributed`: rank 0 saves the one run, atomically."""
    from dataclasses import replace

    from cbsite.collector.distributed.collect import collect_distributed
    from cbsite.collector.distributed.group import close, init

    group = init(args.device, args.dist_timeout)
    try:
        if group.rank != 0:  # one progress display and one summary: rank 0's
            request = replace(request, config=replace(request.config, progress=False))
        with _staging_in(args.runs):
            run = collect_distributed(request, group)
        if run is not None:
            path = run.save(args.runs)
            _print_run(run, top=args.top)
            print(f"saved {path} ({group.world_size} ranks)")
    finally:
        close()
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from rich.table import Table

    from rich.markup import escape

    from cbsite.archive import invalid_folders, list_runs, read_meta

    _note_stale(args.runs)
    refs = list_runs(args.runs)
    invalid = [] if args.model else invalid_folders(args.runs)
    if not refs and not invalid:
        print(f"no runs in {args.runs}; collect one with: cbsite collect dlrm --version v1")
        return 0
    table = Table("model", "version", "run id", "device", "components", "failed", "wall s")
    for folder, problem in invalid:
        table.add_row(escape(folder), "", "", f"[red]{escape(problem)}[/red]", "", "", "")
    for ref in refs:
        if args.model and ref.model != args.model:
            continue
        try:
            meta = read_meta(ref.path)
        except CbsiteError as exc:
            table.add_row(ref.model, ref.version, ref.run_id, f"[red]unreadable: {escape(str(exc))}[/red]", "", "", "")
            continue
        counts = meta.get("counts", {})
        table.add_row(
            ref.model, ref.version, ref.run_id, escape(str(meta["device"].get("name", "?"))),
            str(meta.get("components", sum(counts.values()))), str(counts.get("failed", 0)), _fmt(meta.get("wall_time_s"), digits=1, fixed=True),
        )
    _console().print(table)
    return 0


def _console():
    from rich.console import Console

    # Piped output (CI logs, files) gets a wide table rather than rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _fmt(value: Any, scale: float = 1.0, digits: int = 3, fixed: bool = False) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    return f"{value * scale:.{digits}{'f' if fixed else 'g'}}"


def _note_stale(root: Path) -> None:
    """One line on stderr when killed or interrupted runs left folders in the archive, naming the command."""
    from cbsite.archive import shown, stale_staging

    try:
        stale = stale_staging(root)
    except OSError:
        return
    if stale:
        n = len(stale)
        print(f"cbsite: {n} unfinished run folder{'s' * (n != 1)} in {shown(root)} left by interrupted runs; "
              f"remove {'them' if n != 1 else 'it'} with: cbsite gc --runs {shown(root)}", file=sys.stderr)


def _staging_in(root: Path):
    """Plugin artifacts of the runs collected meanwhile are staged in the archive (see archive.py)."""
    from cbsite.archive import staging_dir
    from cbsite.collector.plugins.runner import staging_in

    return staging_in(staging_dir(root))


def _print_run(run: Any, top: int = 15) -> None:
    """Summary and the components that cost the most forward+backward time, as a terminal table."""
    import polars as pl
    from rich.markup import escape
    from rich.table import Table

    meta = run.meta
    console = _console()
    dev = meta["device"]
    peaks = dev.get("peak_flops")
    peak = next(iter(peaks.values()), None) if isinstance(peaks, dict) and peaks else None
    source = dev.get("peak_source")
    source = source.get("flops") if isinstance(source, dict) else source
    # Everything from the archive is printed as text, never read as rich markup.
    console.print(
        f"[bold]{meta['model']}@{meta['version']}[/bold]  {meta['run_id']}  " + escape(
            f"{dev.get('name')} ({dev.get('kind')}, {dev.get('num_threads')} threads)  dtype {meta['dtype']}  "
            f"peak {_fmt(peak, 1e-12)} TFLOP/s ({source})  wall {_fmt(meta['wall_time_s'], digits=1, fixed=True)}s  "
            f"components {counts_text(meta)}"),
        highlight=False,
    )
    breakdown = meta.get("breakdown_s")
    if isinstance(breakdown, dict) and breakdown:
        order = ("preserve_model", "setup_and_capture", "calibration_start", "components", "components_timed_blocks", "components_plugins",
                 "components_capture", "components_quiet_waits", "components_counting", "components_memory_peaks",
                 "components_backward_graphs", "components_warm_up", "components_block_sizing", "components_other", "hierarchy_remeasure",
                 "hierarchy_remeasure_timed_blocks", "rounds",
                 "calibration_end_and_peak_checks", "step")
        keys = [k for k in order if k in breakdown] + sorted(k for k in breakdown if k not in order)
        parts = ", ".join(f"{k.replace('_', ' ')} {breakdown[k]:.1f}s" for k in keys if isinstance(breakdown[k], (int, float)))
        console.print(f"time: {parts}", markup=False, highlight=False)
    mem = meta.get("memory")
    if isinstance(mem, dict) and mem:
        def gib(value: Any) -> str:
            return f"{value / 2**30:.2f} GiB" if isinstance(value, (int, float)) else "–"

        peak = mem.get("peak_rss_bytes") if mem.get("peak_rss_bytes") is not None else mem.get("peak_device_bytes")
        oom = mem.get("out_of_memory") or []
        setter = mem.get("peak_set_by")
        returned = mem.get("heap_returned")
        anchored = mem.get("capture_anchors")
        console.print(
            f"memory: peak {gib(peak)}, limit {gib(mem.get('limit_bytes'))} ({mem.get('limit_source')}), "
            f"{mem.get('capture_groups')} capture group(s) in {mem.get('capture_forwards')} forwards"
            + (f" and {anchored['batches']} replay(s) of their anchors"
               if isinstance(anchored, dict) and anchored.get("batches") else "")
            + (" (the first group's batch 0 taken in the whole model's peak pass)" if mem.get("capture_rode_root") else "")
            + ((f"; peak reached in stage {str(setter.get('stage')).replace('_', ' ')}" if setter.get("what") == "stage"
                else f"; peak reached in the {setter.get('what')} of {setter.get('path') or '<root>'}")
               if isinstance(setter, dict) and setter.get("peak_bytes") == peak else "")
            + (f"; freed heap handed back after {returned['times']} measurement(s), {gib(returned.get('bytes'))}"
               if isinstance(returned, dict) and returned.get("times") else "")
            + (f"; out of memory: {len(oom)} component phase(s)" if oom else ""),
            markup=False, highlight=False)
    warnings = meta.get("warnings")
    for warning in warnings if isinstance(warnings, list) else []:
        console.print(f"[yellow]warning:[/yellow] {escape(str(warning))}")
    from cbsite.throughput import step_lines

    for line in step_lines(meta):
        console.print(line, markup=False, highlight=False)
    rows = run.table()
    wide = rows.pivot(on="phase", index=["order", "path", "depth", "module_type", "status", "call_count", "param_bytes"],
                      values=["latency_ms", "flops", "mfu", "bandwidth_util"], aggregate_function="first")
    fwd_col = "latency_ms_forward" if "latency_ms_forward" in wide.columns else "latency_ms"
    wide = wide.filter(pl.col("path") != "").sort(pl.col(fwd_col).fill_null(0) * pl.col("call_count").clip(1), descending=True).head(top)
    table = Table("component", "type", "status", "calls", "fwd ms", "bwd ms", "GFLOP fwd", "MFU fwd", "BW util fwd", "MB")
    for r in wide.sort("order").to_dicts():
        table.add_row(
            escape("  " * (r["depth"] - 1) + r["path"]), escape(r["module_type"].rsplit(".", 1)[-1]), r["status"], str(r["call_count"]),
            _fmt(r.get("latency_ms_forward")), _fmt(r.get("latency_ms_backward")), _fmt(r.get("flops_forward"), 1e-9),
            _fmt(r.get("mfu_forward")), _fmt(r.get("bandwidth_util_forward")), _fmt(r["param_bytes"], 1e-6),
        )
    console.print(table)


def cmd_show(args: argparse.Namespace) -> int:
    from cbsite.archive import read_run, resolve_run

    run = read_run(resolve_run(args.run, args.runs).path)
    _print_run(run, top=args.top)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from cbsite.archive import read_run, resolve_run

    run = read_run(resolve_run(args.run, args.runs).path)
    table = run.table()
    out = args.out or Path(f"{run.model}-{run.version}-{run.run_id}.{args.format}")
    if args.format == "csv":
        run.flat_table().write_csv(out)
    elif args.format == "parquet":
        table.write_parquet(out)
    else:
        out.write_text(json.dumps({"run": run.meta, "rows": table.to_dicts()}, indent=1, default=str))
    print(f"wrote {out}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare HEAD with BASE; print a table, Markdown or JSON; exit 1 when a gate rule is broken."""
    from cbsite import review
    from cbsite.archive import read_run, resolve_run
    from cbsite.comparison import evidence_for
    from cbsite.diff import diff_runs

    # Rules are checked before any run is read, so a typo in a rule fails fast (exit 2).
    rules = _gate_rules(args)
    base_ref, head_ref = resolve_run(args.base, args.runs), resolve_run(args.head, args.runs)
    base_run, head_run = read_run(base_ref.path), read_run(head_ref.path)
    rd = diff_runs(base_run, head_run, match_moved=args.match_moved)
    phase = review.main_phase(rd, args.phase) if args.phase else None
    evidence = evidence_for(args.runs, base_run, head_run, {c.path: c.base_path for c in rd.components if c.base_path})
    gate = review.check(rd, rules, [phase] if phase else None, latency=evidence) if rules else None
    return _report_diff(args, rd, gate, evidence, phase, base_ref, head_ref)


def _report_diff(args: argparse.Namespace, rd: Any, gate: Any, evidence: Any, phase: str | None, base_ref: Any,
                 head_ref: Any) -> int:
    """Print a diff (table, Markdown or JSON) with its latency verdicts; the exit status of its gate."""
    from cbsite import review
    url = review.diff_page_url(args.site_url, base_ref, head_ref, args.runs) if args.site_url else None
    if args.format == "markdown":
        sys.stdout.write(review.markdown(rd, gate, phase=phase, site_url=url, top=args.top, latency=evidence))
    elif args.format == "json":
        print(json.dumps(review.to_json(rd, gate, match_moved=args.match_moved, site_url=url, latency=evidence), indent=1))
    else:
        review.print_table(rd, gate, _console(), phase=phase, top=args.top, latency=evidence)
        if url:
            print(f"diff page: {url}")
    return 0 if gate is None or gate.passed else 1


def _gate_rules(args: argparse.Namespace) -> list[Any]:
    """--fail-on rules, else those of the configuration file; checked before anything runs (exit 2 on a typo)."""
    from cbsite import review

    if args.fail_on:
        return review.parse_rules(args.fail_on)
    found = review.config_rules(Path.cwd())
    return found[0] if found is not None else []


def cmd_compare(args: argparse.Namespace) -> int:
    """Measure BASE and HEAD together in one session; print verdicts; exit 1 when a gate rule is broken."""
    from cbsite import review
    from cbsite.collector.collect import CollectRequest
    from cbsite.collector.session.compare import CompareConfig, compare
    from cbsite.comparison import from_record
    from cbsite.diff import diff_runs

    rules = _gate_rules(args)
    config = _collect_config(args)
    cfg = CompareConfig(processes=args.processes, layout=args.order, pairs=args.pairs, block_s=args.block_time,
                        alpha=args.alpha, floor=args.floor, share_inputs=not args.no_shared_inputs)
    worktree = None
    if args.base_rev:
        worktree = _worktree(args.base_rev)
        cfg = CompareConfig(**{**cfg.__dict__, "layout": "abba", "base_sys_path": (str(worktree),)})
    common = dict(batches=args.batches, seed=args.seed, config=config, tags=tuple(args.tag), notes=args.notes)
    base = CollectRequest(provider=args.base, options=_parse_options(args.base_option), model_name=args.model,
                          version=args.base_version, **common)
    head = CollectRequest(provider=args.head, options=_parse_options(args.head_option), model_name=args.model,
                          version=args.head_version, **common)
    try:
        with _staging_in(args.runs):
            result = compare(base, head, cfg, progress=config.progress,
                             say=lambda line: print(line, file=sys.stderr, flush=True))
            path = result.save(args.runs)
    finally:
        if worktree is not None:
            _remove_worktree(worktree)
    rd = diff_runs(result.base, result.head, match_moved=True)
    evidence = from_record(result.record)
    gate = review.check(rd, rules, None, latency=evidence) if rules else None
    summary = result.record["summary"]["verdicts"]
    print(f"saved {result.base.path}\nsaved {result.head.path}\ncomparison {path} "
          f"({result.record['wall_s']:.0f} s, {cfg.processes} processes, {result.record['threads']} thread(s)): "
          + ", ".join(f"{n} {v}" for v, n in summary.items() if n), file=sys.stderr)
    args.match_moved, args.site_url, args.phase = True, None, None
    return _report_diff(args, rd, gate, evidence, None, _ref(result.base), _ref(result.head))


def _ref(run: Any) -> Any:
    from cbsite.archive import RunRef

    return RunRef(run.model, run.version, run.run_id, run.path)


def _worktree(rev: str) -> Path:
    """A detached git worktree of REV in a temporary folder: the base side imports the package from there."""
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="cbsite-base-rev-"))
    done = subprocess.run(["git", "worktree", "add", "--detach", str(folder), rev], capture_output=True, text=True)
    if done.returncode != 0:
        raise CbsiteError(f"--base-rev {rev}: git worktree add failed: {done.stderr.strip() or done.stdout.strip()}; "
                          "run cbsite compare inside the git repository of the package under test")
    return folder


def _remove_worktree(folder: Path) -> None:
    import subprocess

    subprocess.run(["git", "worktree", "remove", "--force", str(folder)], capture_output=True)


def cmd_build(args: argparse.Namespace) -> int:
    from cbsite.generator import build_site

    pairs = [tuple(p.split("..", 1)) for p in args.diff]
    if any(len(p) != 2 for p in pairs):
        raise CbsiteError("--diff takes BASE..HEAD, e.g. --diff dlrm@v1..dlrm@v3")
    _note_stale(args.runs)
    out = build_site(args.runs, args.out, config=args.config, perfetto_origin=args.perfetto_origin, extra_diffs=pairs,
                     allow_empty=args.allow_empty, cache=args.cache)
    print(f"site built in {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from cbsite.generator import publish_site

    out = publish_site(
        args.runs, args.out, args.site_version, aliases=args.alias, set_default=args.set_default,
        title=args.title, config=args.config, perfetto_origin=args.perfetto_origin, allow_empty=args.allow_empty,
    )
    print(f"published version {args.site_version} into {out} (serve it over HTTP: cbsite serve {args.out})")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove what killed or interrupted runs left in the archive; never a folder a live process is writing."""
    from cbsite.archive import foreign_staging, remove_stale, shown

    removed = remove_stale(args.runs, dry_run=args.dry_run)
    for stale in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {shown(stale.path)}  ({stale.reason})")
    for other in foreign_staging(args.runs):  # only what cbsite staged is removed; the rest is named
        print(f"left {shown(other.path)}  ({other.reason})")
    if not removed:
        print(f"nothing to remove in {shown(args.runs)}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Rewrite the archive's older runs at the current schema, in place, one atomic file at a time."""
    from cbsite.archive import shown, upgrade_archive
    from cbsite.schema import SCHEMA_VERSION

    if not args.runs.is_dir():
        raise CbsiteError(f"no archive at {shown(args.runs)}: give the folder of your runs with --runs")
    upgraded, current = upgrade_archive(args.runs, dry_run=args.dry_run)
    for item in upgraded:
        print(f"{'would upgrade' if args.dry_run else 'upgraded'} {shown(item.path)}  "
              f"(schema {item.found} -> {SCHEMA_VERSION})")
    print(f"{len(upgraded)} run{'s' * (len(upgraded) != 1)} {'to upgrade' if args.dry_run else 'upgraded'}, "
          f"{current} already at schema {SCHEMA_VERSION}, in {shown(args.runs)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from cbsite.generator import serve

    serve(args.dir, host=args.host, port=args.port)
    return 0


# The demo comes in two sizes. `cbsite demo --full` (make demo-full; what collected the committed runs, about
# 9 minutes on 2 cores) collects every demo model with trace, ops, log, memory and compile, compiling components
# down to depth 2 (each in a cold inductor cache: seconds per component on CPU), and times the DLRM pair in
# compare's default six worker processes of eight block pairs.
DEMO_PLUGINS = ("trace", "ops", "log", "memory", "compile")
DEMO_PLUGIN_OPTIONS = {"compile": {"max_depth": 2}}
# `cbsite demo` (make demo), the quick first look, about 2 minutes on 2 cores (manual: Getting started): the DLRM pair is always
# measured, without compile (the compile plugin alone took ~36 s a model) and in three worker processes of four
# pairs (its verdicts follow the same rule, with fewer units behind them: more are inconclusive); deepfm, nanogpt
# and the study are collected only where the archive lacks them unchanged (`_kept_demo_run`: the committed runs
# count on the machine that collected them). --plugin / --plugin-option replace the plugin choice in both.
DEMO_QUICK_PLUGINS = ("trace", "ops", "log", "memory")
DEMO_QUICK_COMPARE = {"processes": 3, "pairs": 4}


def _kept_demo_run(runs: Path, provider: str, name: str, version: str, options: dict[str, Any], config: Any) -> Path | None:
    """A demo run of name@version already in the archive that this collection would repeat: the same provider and
    options, device (kind and CPU name), dtype, intra-op threads, torch version, phases, depth, budget, and at
    least the plugins (with the same options) asked for now. The newest such run, or None."""
    from cbsite import archive
    from cbsite.collector.device import cpu_name
    from cbsite.collector.profiler import threads_for
    from cbsite.provenance import package_versions

    torch_version = package_versions(("torch",))["torch"]  # as run.json records it; no torch import in the CLI

    for ref in reversed([r for r in archive.list_runs(runs) if (r.model, r.version) == (name, version)]):
        try:
            meta = archive.read_meta(ref.path)
        except Exception:  # noqa: BLE001 - an unreadable run is no reason to keep it
            continue
        got, device, plugins = meta.get("config", {}), meta.get("device", {}), meta.get("config", {}).get("plugins", {})
        same = (
            "demo" in meta.get("tags", ()) and meta.get("provider", {}).get("name") == provider
            and options.items() <= meta.get("provider", {}).get("options", {}).items()
            and device.get("kind") == config.device and (config.device != "cpu" or device.get("name") == cpu_name())
            and meta.get("dtype") == config.dtype and got.get("num_threads") == threads_for(config)
            and meta.get("versions", {}).get("torch") == torch_version
            and list(got.get("phases", ())) == list(config.phases) and got.get("max_depth") == config.max_depth
            and got.get("min_run_time") == config.min_run_time and not config.include and not config.exclude
            and all(p in plugins and all(plugins[p].get("options", {}).get(k) == v
                                         for k, v in config.plugin_options.get(p, {}).items()) for p in config.plugins)
        )
        if same:
            return ref.path
    return None


def cmd_sweep(args: argparse.Namespace) -> int:
    """Collect one run per point of a grid of provider options (a study); --list prints the points only."""
    import re

    from cbsite import study as cstudy

    name = args.study or re.sub(r"[^A-Za-z0-9._-]", "-", f"{args.provider}-study").lstrip("._-")[:64]
    sweep = cstudy.Study.from_grid(name, args.provider, args.grid, base_options=_parse_options(args.option),
                                   zip_axes=args.zip, model=args.model)
    selected = cstudy.select(sweep.points, args.k)
    if args.list:
        done = cstudy.done_points(args.runs, sweep) if args.runs.is_dir() else {}
        print(f"{sweep.describe()}; {len(selected)} selected" + (f" by -k {args.k!r}" if args.k else ""))
        for p in selected:
            options = " ".join(f"{k}={json.dumps(v)}" for k, v in p.options.items())
            print(f"  {p.label}  {options}" + ("  (done)" if p.label in done else ""))
        return 0
    if not selected:
        raise CbsiteError(f"-k {args.k!r} selects none of the {len(sweep.points)} points; see them with --list")
    from cbsite.collector.collect import CollectRequest, Preprocessing
    from cbsite.collector.executors import run_sweep

    config = _collect_config(args)
    config = type(config)(**{**config.__dict__, "progress": False})  # points run in workers: one line each
    request = CollectRequest(provider=args.provider, batches=args.batches, seed=args.seed,
                             preprocessing=Preprocessing(args.shrink_factor, args.shrink_cap, args.batch_size),
                             config=config, tags=tuple(args.tag), notes=args.notes)
    _note_stale(args.runs)
    record = run_sweep(sweep, selected, args.runs, request, executor=args.executor, workers=args.workers,
                       options=_parse_options(args.executor_option), pin=not args.no_pin, expression=args.k,
                       say=lambda line: print(line, flush=True))
    chosen = {p.label for p in selected}
    failed = [e for e in record["points"] if e["label"] in chosen and e["status"] == "failed"]
    done = [e for e in record["points"] if e["label"] in chosen and e["status"] == "done"]
    print(f"study {sweep.name}: {len(done)} of {len(selected)} selected points done, {len(failed)} failed "
          f"(record: {cstudy.folder(args.runs, sweep.name) / cstudy.STUDY_JSON})")
    return 1 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    import time
    from dataclasses import replace

    from cbsite.archive import shown
    from cbsite.collector.collect import CollectRequest, collect
    from cbsite.collector.session.compare import CompareConfig, compare

    started = time.perf_counter()
    plugins = (DEMO_PLUGINS, DEMO_PLUGIN_OPTIONS) if args.full else (DEMO_QUICK_PLUGINS, {})
    config = _collect_config(args, _plugin_selection(args, *plugins))
    if not args.collect_only:  # a site folder that would be refused is refused before minutes of collecting
        from cbsite.generator.sitedir import check_out

        check_out(args.out, args.runs)
    print(f"the {'full' if args.full else 'quick'} demo, on {config.device}, with {', '.join(config.plugins) or 'no plugins'}"
          + ("" if args.full else " (cbsite demo --full: every model recollected, compiled, timed in more processes)"),
          flush=True)
    # The two DLRM revisions are measured together (cbsite compare), so their diff page carries latency
    # verdicts; the other models are single runs.
    (provider, name, base_version, base_options), (_, _, head_version, head_options) = DEMO[:2]
    cfg = CompareConfig() if args.full else CompareConfig(**DEMO_QUICK_COMPARE)
    print(f"comparing {name}@{base_version} and {name}@{head_version} in one session ...", flush=True)
    with _staging_in(args.runs):
        side = dict(provider=provider, model_name=name, config=config, tags=("demo",))
        result = compare(CollectRequest(options=base_options, version=base_version, **side),
                         CollectRequest(options=head_options, version=head_version, **side),
                         cfg, progress=config.progress, say=lambda line: print("  " + line, flush=True))
        record = result.save(args.runs)
    verdicts = ", ".join(f"{n} {v}" for v, n in result.record["summary"]["verdicts"].items() if n)
    print(f"  saved {result.base.path}, {result.head.path} and {record} ({result.record['wall_s']:.1f}s; {verdicts})",
          flush=True)
    for provider, name, version, options in DEMO[2:]:
        kept = None if args.full else _kept_demo_run(args.runs, provider, name, version, options, config)
        if kept is not None:
            print(f"kept {name}@{version}: {shown(kept)} was collected the same way on this machine", flush=True)
            continue
        print(f"collecting {name}@{version} ...", flush=True)
        with _staging_in(args.runs):
            run = collect(CollectRequest(provider=provider, options=options, model_name=name, version=version,
                                         config=config, tags=("demo",)))
        print(f"  saved {run.save(args.runs)}  ({run.meta['wall_time_s']:.1f}s; {counts_text(run.meta)})", flush=True)
    from cbsite import study as cstudy
    from cbsite.collector.executors import run_sweep

    provider, name, base_options, grid = DEMO_STUDY  # as `cbsite sweep`; points already in the archive are kept
    sweep = cstudy.Study.from_grid(name, provider, grid, base_options=base_options)
    print(f"sweeping study {name} ({len(sweep.points)} points, no plugins) ...", flush=True)
    request = CollectRequest(provider=provider, config=replace(config, **DEMO_STUDY_CONFIG), tags=("demo",))
    record = run_sweep(sweep, sweep.points, args.runs, request, say=lambda line: print("  " + line, flush=True))
    failed = [f"{e['label']}: {e['error']}" for e in record["points"] if e["status"] == "failed"]
    if failed:
        raise CbsiteError(f"the demo study {name} has failed points: " + "; ".join(failed))
    print(f"collected in {time.perf_counter() - started:.0f} s", flush=True)
    if args.collect_only:
        return 0
    code = cmd_build(args)
    print(f"demo done in {time.perf_counter() - started:.0f} s", flush=True)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cbsite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("collect", help="profile every submodule of a model into the archive")
    p.add_argument("provider", help="dlrm | deepfm | dlrm-synthetic | nanogpt | package.module:function")
    p.add_argument("--version", default="v0", help="version name, or 'auto' for the git short hash (+ -dirty)")
    p.add_argument("--model", default=None, help="model name in the archive (default: the provider's)")
    p.add_argument("-o", "--option", action="append", default=[], help="provider option key=value; repeatable")
    p.add_argument("--batches", type=int, default=3, help="distinct example batches replayed in rotation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shrink-factor", type=float, default=None, help="divide embedding hash sizes by this")
    p.add_argument("--shrink-cap", type=int, default=None, help="cap embedding hash sizes at this many rows")
    p.add_argument("--batch-size", type=int, default=None, help="replicate the example batch to this size")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--notes", default="")
    p.add_argument("--top", type=int, default=15, help="components shown in the summary table")
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a sharded model's collection: launch with torchrun --nproc-per-node N -m cbsite collect "
                        "... --distributed (manual: Sharded models)")
    p.add_argument("--dist-timeout", type=float, default=300.0,
                   help="seconds a collective may wait for the other ranks before the job ends (default 300)")
    _add_collect_args(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("ls", help="list runs")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--model", default=None)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", help="print one run: RUN is a run id, model@version, model or a run folder")
    p.add_argument("run")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--top", type=int, default=25)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "diff", help="compare two runs (run id, model@version, model or run folder); gate with --fail-on",
        description="Compare HEAD with BASE. Exit status: 0 passed (or no rules), 1 a --fail-on rule is broken, "
                    "2 a usage error (bad rule, unknown run).")
    p.add_argument("base", help="the older run: run id, model@version (its newest run), model or run folder")
    p.add_argument("head", help="the newer run, in the same forms")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table",
                   help="table (terminal), markdown (a PR comment) or json (see cbsite/diff.schema.json)")
    p.add_argument("--phase", choices=("forward", "backward"), default=None,
                   help="compare and gate one phase only (default: every phase both runs have)")
    p.add_argument("--match-moved", action=argparse.BooleanOptionalAction, default=True,
                   help="match renamed or re-wrapped modules by structure and report them as moved (default: on)")
    p.add_argument("--fail-on", action="append", default=[], metavar="RULE",
                   help="gate rule [GLOB:]METRIC>+N%%, e.g. flops>+5%% or 'over_arch.*:latency>+20%%'; repeatable; "
                        "replaces fail_on of [tool.cbsite.gate] in pyproject.toml")
    p.add_argument("--site-url", default=None, help="URL of the published site version; links the diff page")
    p.add_argument("--top", type=int, default=5, help="top contributors shown per metric")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser(
        "compare", help="measure two models (providers and options) together and judge every component's latency",
        description="Collect BASE and HEAD as runs, then time both in fresh worker processes in random A/B block "
                    "pairs, and judge every component: regressed, improved, unchanged or inconclusive. Exit status: "
                    "0 passed (or no rules), 1 a --fail-on rule is broken, 2 a usage error.")
    p.add_argument("base", help="base provider: dlrm | deepfm | dlrm-synthetic | nanogpt | package.module:function")
    p.add_argument("head", help="head provider, in the same forms (often the same one with other options)")
    p.add_argument("-B", "--base-option", action="append", default=[], help="base provider option key=value; repeatable")
    p.add_argument("-H", "--head-option", action="append", default=[], help="head provider option key=value; repeatable")
    p.add_argument("--base-version", default="base", help="version name of the base run (default: base)")
    p.add_argument("--head-version", default="head", help="version name of the head run (default: head)")
    p.add_argument("--model", default=None, help="model name in the archive for both (default: the provider's)")
    p.add_argument("--base-rev", default=None,
                   help="git revision of the package for the base side (a worktree; processes alternate ABBA)")
    p.add_argument("--processes", type=int, default=6, help="worker processes, one after another (default 6)")
    p.add_argument("--order", choices=("interleaved", "abba"), default="interleaved",
                   help="interleaved: both sides in every process, random A/B block pairs (default); "
                        "abba: one side per process in A B B A order")
    p.add_argument("--pairs", type=int, default=8, help="A/B block pairs per component, phase and process")
    p.add_argument("--block-time", type=float, default=0.01, help="seconds of one timed block (default 0.01)")
    p.add_argument("--alpha", type=float, default=0.01, help="level of the one-sided tests (default 0.01)")
    p.add_argument("--floor", type=float, default=0.05,
                   help="smallest relative change called regressed or improved (default 0.05 = 5%%)")
    p.add_argument("--no-shared-inputs", action="store_true",
                   help="time each side on its own captured inputs even where the shapes agree")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--notes", default="")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.add_argument("--fail-on", action="append", default=[], metavar="RULE",
                   help="gate rule [GLOB:]METRIC>+N%%; latency rules use the verdicts (N%% is the magnitude floor)")
    p.add_argument("--top", type=int, default=5)
    _add_collect_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "sweep", help="collect one run per point of a grid of provider options (a study)",
        description="Run a study: the cross product (or --zip) of --grid option values, one run per point, tagged "
                    "study:NAME and point:LABEL (the label is the run's version). Points already in the archive are "
                    "skipped; a failing point is recorded in runs/_studies/NAME/study.json and the others go on. "
                    "Exit status: 0 all selected points done, 1 some failed, 2 a usage error.")
    p.add_argument("provider", help="dlrm | deepfm | dlrm-synthetic | nanogpt | package.module:function")
    p.add_argument("--grid", action="append", default=[], required=True, metavar="KEY=V1,V2,...",
                   help="an axis: provider option and its values (JSON where they parse); repeatable")
    p.add_argument("--zip", action="store_true", help="zip the axes (i-th values together) instead of the cross product")
    p.add_argument("--list", action="store_true", help="print the points and their labels; run nothing")
    p.add_argument("-k", default=None, metavar="EXPR",
                   help="select points by label as pytest -k does: substrings with and, or, not, parentheses")
    p.add_argument("--study", default=None, help="study name (default: PROVIDER-study)")
    p.add_argument("--model", default=None, help="model name of the points' runs (default: the study name)")
    p.add_argument("--executor", choices=("local", "submitit", "ray"), default="local",
                   help="local: pinned process pool; submitit: Slurm job arrays (or cluster=local|debug); ray: optional")
    p.add_argument("--workers", type=int, default=1, help="points at once (local: one exclusive core set each)")
    p.add_argument("--executor-option", action="append", default=[], metavar="KEY=VALUE",
                   help="submitit parameters, e.g. cluster=local, slurm_partition=dev, cpus_per_task=8; repeatable")
    p.add_argument("--no-pin", action="store_true", help="local executor: do not pin workers to cores (benchmarks)")
    p.add_argument("-o", "--option", action="append", default=[], help="provider option shared by every point")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shrink-factor", type=float, default=None)
    p.add_argument("--shrink-cap", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--notes", default="")
    _add_collect_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="write one run as csv, parquet or json")
    p.add_argument("run")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--format", choices=("csv", "parquet", "json"), default="csv")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_export)

    def site_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--config", type=Path, default=None, help="base mkdocs.yml (default: ./mkdocs.yml)")
        q.add_argument("--perfetto-origin", default="https://ui.perfetto.dev", help="Perfetto UI origin (self-hosted too)")
        q.add_argument("--allow-empty", action="store_true",
                       help="let an archive with no readable run replace an existing site (refused otherwise)")

    p = sub.add_parser("build", help="build the site from the archive")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--out", type=Path, default=Path("site"))
    p.add_argument("--diff", action="append", default=[], help="extra diff page BASE..HEAD; repeatable")
    p.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="build cache kept between builds: only new or changed runs and their diffs are computed")
    site_args(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("publish", help="publish the site as a version in mike's layout")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--site-version", required=True)
    p.add_argument("--alias", action="append", default=[])
    p.add_argument("--set-default", action="store_true", help="make the root redirect to this version/alias")
    p.add_argument("--title", default=None)
    site_args(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("gc", help="remove the unfinished run folders that killed or interrupted runs left in the archive")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("upgrade", help="rewrite the archive's runs of older schema versions at the current one, in place",
                       description="Rewrite every run of an older schema version at the current one, as the reader "
                                   "migrates it; each file is staged and renamed into place, run.json last.")
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="archive folder (default: runs)")
    p.add_argument("--dry-run", action="store_true", help="list the runs that would be rewritten, change nothing")
    p.set_defaults(func=cmd_upgrade)

    p = sub.add_parser("serve", help="serve a built or published site on localhost")
    p.add_argument("dir", type=Path, nargs="?", default=Path("site"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="collect the demo models on CPU and build the site")
    p.add_argument("--out", type=Path, default=Path("site"))
    p.add_argument("--collect-only", action="store_true")
    p.add_argument("--full", action="store_true",
                   help="the complete demo (about 9 minutes on 2 cores): every model recollected and compiled to depth 2, "
                        "the DLRM pair timed in 6 worker processes; by default a quick one (about 2 minutes on 2 cores)")
    p.add_argument("--diff", action="append", default=[])
    p.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="build cache kept between builds (as cbsite build --cache)")
    site_args(p)
    _add_collect_args(p)
    p.set_defaults(func=cmd_demo)
    return parser


INTERNAL_ERROR = 3  # exit 1 is "a gate rule is broken" (diff, compare): an uncaught exception must not read as that


class Terminated(KeyboardInterrupt):
    """SIGTERM (CI cancellation, `timeout`, `kill`), raised like Ctrl-C so that every cleanup runs."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def _whole(low: int, high: int | None = None) -> Any:
    """A check of a whole number from `low` (to `high`)."""
    def check(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    return check


def _real(low: float, high: float = math.inf, low_open: bool = True, high_open: bool = True) -> Any:
    """A check of a finite number in the interval from `low` to `high` (open ends unless said)."""
    def check(value: Any) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and (value > low if low_open else value >= low) and (value < high if high_open else value <= high))
    return check


# Every number a user gives, checked before any work (exit 2, every bad one in one line): a nan budget never ends, a
# zero floor failed only after a whole session, a negative worker count failed inside an executor.
# option dest -> (flag, check, what it must be)
NUMBERS: dict[str, tuple[str, Any, str]] = {
    "max_depth": ("--max-depth", _whole(0), "a whole number of 0 or more"),
    "budget": ("--budget", _real(0), "a finite number of seconds above 0"),
    "peak_flops": ("--peak-flops", _real(0), "a finite FLOP/s figure above 0, e.g. 1.2e12"),
    "peak_bandwidth": ("--peak-bandwidth", _real(0), "a finite bytes/s figure above 0, e.g. 2e10"),
    "threads": ("--threads", _whole(1), "a whole number of 1 or more"),
    "rounds": ("--rounds", _whole(1, 1000), "a whole number from 1 to 1000"),
    "max_component_s": ("--max-component-s", _real(0), "a finite number of seconds above 0"),
    "batches": ("--batches", _whole(1, 10_000), "a whole number from 1 to 10000"),
    "shrink_factor": ("--shrink-factor", _real(0), "a finite number above 0, e.g. 10"),
    "shrink_cap": ("--shrink-cap", _whole(1), "a whole number of rows, 1 or more"),
    "batch_size": ("--batch-size", _whole(1), "a whole number of 1 or more"),
    "top": ("--top", _whole(0), "a whole number of 0 or more"),
    "dist_timeout": ("--dist-timeout", _real(0), "a finite number of seconds above 0"),
    "processes": ("--processes", _whole(2, 1000), "a whole number from 2 to 1000 (a verdict needs 2 units)"),
    "pairs": ("--pairs", _whole(1, 10_000), "a whole number from 1 to 10000"),
    "block_time": ("--block-time", _real(0, 10), "a number of seconds above 0 and below 10"),
    "alpha": ("--alpha", _real(0, 0.5), "a level above 0 and below 0.5, e.g. 0.01"),
    # A floor of 0 is allowed: every change judged by its significance alone, with no magnitude floor
    # (then "unchanged" cannot be shown: equivalence needs a margin, so what is not significant is inconclusive).
    "floor": ("--floor", _real(0, 10, low_open=False), "a fraction from 0 (no magnitude floor) to below 10, e.g. 0.05"),
    "workers": ("--workers", _whole(1, 4096), "a whole number of 1 or more"),
    "port": ("--port", _whole(0, 65535), "a port number from 0 to 65535"),
}


def check_numbers(args: argparse.Namespace) -> None:
    """Every number of `args` against NUMBERS (None: the option's default, left to its command); one CbsiteError
    naming every bad one, before anything runs."""
    problems = []
    for dest, (flag, ok, what) in NUMBERS.items():
        value = getattr(args, dest, None)
        if value is not None and not ok(value):
            problems.append(f"{flag} must be {what}, got {value!r}")
    if problems:
        raise CbsiteError("; ".join(problems))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Only the main thread may set handlers (main() called from a worker thread keeps the default).
    installed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if installed else None
    try:
        check_numbers(args)
        return args.func(args)
    except CbsiteError as exc:
        print(f"cbsite: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("cbsite: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("cbsite: interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - a bug: its traceback, and an exit status CI cannot read as "regressed" (1)
        import traceback

        traceback.print_exc()
        print(f"cbsite: internal error (a bug in cbsite or a plugin, not a regression); exit {INTERNAL_ERROR}",
              file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    raise SystemExit(main())
