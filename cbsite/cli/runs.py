"""The commands that read or tidy the archive: `ls`, `show`, `export`, `gc`, `upgrade`. None imports torch."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from cbsite import format as fmt
from cbsite.cli.common import add_command, console, note_stale, verbosity
from cbsite.cli.completion import completes, run_names
from cbsite.cli.runview import print_run, run_json, wall_time
from cbsite.errors import CbsiteError


def ls_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One dict per run (and per folder that is no readable run), as `ls` prints them."""
    from cbsite.archive import invalid_folders, list_runs, read_meta

    rows: list[dict[str, Any]] = []
    for folder, problem in [] if args.model else invalid_folders(args.runs):
        rows.append({"folder": str(folder), "problem": problem})
    for ref in list_runs(args.runs):
        if args.model and ref.model != args.model:
            continue
        row: dict[str, Any] = {"model": ref.model, "version": ref.version, "run_id": ref.run_id, "path": str(ref.path)}
        try:
            meta = read_meta(ref.path)
        except CbsiteError as exc:
            rows.append({**row, "problem": f"unreadable: {exc}"})
            continue
        counts = meta.get("counts", {})
        rows.append({**row, "device": meta["device"].get("name"), "components": meta.get("components", sum(counts.values())),
                     "counts": counts, "failed": counts.get("failed", 0), "wall_time_s": meta.get("wall_time_s"),
                     "created_at": meta.get("created_at")})
    return rows


def cmd_ls(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    note_stale(args.runs)
    rows = ls_rows(args)
    if args.format == "json":
        print(json.dumps(fmt.json_safe(rows), indent=1, default=str))
        return 0
    if not rows:
        print(f"no runs in {args.runs}; collect one with: cbsite collect dlrm --version v1")
        return 0
    table = Table("model", "version", "run id", "device", "components", "failed", "wall")
    for r in rows:
        if "run_id" not in r:
            table.add_row(escape(r["folder"]), "", "", f"[red]{escape(r['problem'])}[/red]", "", "", "")
        elif "problem" in r:
            table.add_row(r["model"], r["version"], r["run_id"], f"[red]{escape(r['problem'])}[/red]", "", "", "")
        else:
            table.add_row(r["model"], r["version"], r["run_id"], escape(str(r["device"] or "?")), str(r["components"]),
                          str(r["failed"]), wall_time(r["wall_time_s"]))
    console().print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from cbsite.archive import read_run, resolve_run

    run = read_run(resolve_run(args.run, args.runs).path)
    if args.format == "json":
        print(json.dumps(run_json(run, args.top), indent=1, default=str))
    else:
        print_run(run, top=args.top, verbosity=verbosity(args))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """One run as CSV, Parquet or JSON, into a file or (`--out -`) onto stdout."""
    from cbsite.archive import read_run, resolve_run

    run = read_run(resolve_run(args.run, args.runs).path)
    to_stdout = str(args.out) == "-"
    if args.format == "csv":
        data: bytes = run.flat_table().write_csv().encode()
    elif args.format == "parquet":
        buffer = io.BytesIO()
        run.table().write_parquet(buffer)
        data = buffer.getvalue()
    else:
        data = json.dumps({"run": run.meta, "rows": run.table().to_dicts()}, indent=1, default=str).encode()
    if to_stdout:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    out = args.out or Path(f"{run.model}-{run.version}-{run.run_id}.{args.format}")
    out.write_bytes(data)
    print(f"wrote {out}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove what killed or interrupted runs left in the archive; never a folder a live process is writing."""
    from cbsite.archive import shown
    from cbsite.leftovers import foreign_staging, remove_stale

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


RUN_HELP = "run id, model@version (its newest run), model (its newest run) or run folder"


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "ls", "list the runs of the archive",
                    "List the runs of the archive, newest last, and any folder that is not a readable run.", parents)
    p.add_argument("--model", default=None, help="only this model's runs (default: every model)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (terminal) or json (one object per run)")
    p.set_defaults(func=cmd_ls)

    p = add_command(sub, "show", "print one run: its summary and the components that cost the most", parents=parents)
    completes(p.add_argument("run", help=RUN_HELP), run_names)
    p.add_argument("--top", type=int, default=25, help="components shown in the table")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (terminal) or json (run.json and the top components' figures)")
    p.set_defaults(func=cmd_show)

    p = add_command(sub, "export", "write one run as csv, parquet or json",
                    "Write one run's rows (and, for json, its run.json) as csv, parquet or json, into a file or onto "
                    "stdout with --out -.", parents)
    completes(p.add_argument("run", help=RUN_HELP), run_names)
    p.add_argument("--format", choices=("csv", "parquet", "json"), default="csv", help="file format")
    p.add_argument("--out", type=Path, default=None,
                   help="file to write, or - for stdout (default: MODEL-VERSION-RUNID.FORMAT here)")
    p.set_defaults(func=cmd_export)

    p = add_command(sub, "gc", "remove what killed or interrupted runs left in the archive",
                    "Remove the unfinished run folders that killed or interrupted runs left in the archive; never a "
                    "folder a live process is writing.", parents)
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.set_defaults(func=cmd_gc)

    p = add_command(sub, "upgrade", "rewrite the runs of older schema versions at the current one, in place",
                    "Rewrite every run of an older schema version at the current one, as the reader migrates it; each "
                    "file is staged and renamed into place, run.json last.", parents)
    p.add_argument("--dry-run", action="store_true", help="list the runs that would be rewritten, change nothing")
    p.set_defaults(func=cmd_upgrade)
