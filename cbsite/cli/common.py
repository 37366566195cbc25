"""What every command group shares: the parent parsers (archive, verbosity), the help format, the checks of the
numbers a user gives, and the few archive helpers several commands call."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from cbsite.errors import CbsiteError

DEFAULT_RUNS = Path(os.environ.get("CBSITE_RUNS", "runs"))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, as pytest and mkdocs show it; left out where it says nothing (None, off,
    an empty list) or where the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        says_nothing = (default is None or default is False or default == [] or default == "" or default == argparse.SUPPRESS
                        or isinstance(action, argparse._CountAction))
        if "default" in text or says_nothing or not action.option_strings:
            return text
        return super()._get_help_string(action)


def add_command(sub: Any, name: str, summary: str, description: str | None = None,
                parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """A subcommand with its one-line summary (the list of `cbsite --help`) and its description (its own --help)."""
    return sub.add_parser(name, help=summary, description=description or summary[:1].upper() + summary[1:] + ".",
                          formatter_class=HelpFormatter, parents=list(parents))


def verbosity_parent() -> argparse.ArgumentParser:
    """-q/-v on `cbsite` itself and on every command: -v adds third-party warnings, mkdocs' INFO lines and the
    collection's stage times. No default is stored (SUPPRESS): a subcommand copies its namespace over the top-level
    one, and a stored 0 would erase a -v given before the command; `verbosity` reads an absent count as 0."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("verbosity")
    group.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS,
                       help="less output: no progress and no summary tables, results and errors only")
    group.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                       help="more output: third-party warnings (torch, mkdocs INFO) and the stage times of a collection")
    return parent


def runs_parent() -> argparse.ArgumentParser:
    """--runs on every command that reads or writes the archive."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument_group("archive").add_argument(
        "--runs", type=Path, default=DEFAULT_RUNS, help="archive folder (default: $CBSITE_RUNS or runs)")
    return parent


def verbosity(args: argparse.Namespace) -> int:
    """-1 quiet, 0 normal, 1 and up verbose."""
    return getattr(args, "verbose", 0) - getattr(args, "quiet", 0)


def require(*modules: str) -> None:
    """ModuleNotFoundError for the first of `modules` that is not installed, before a command starts any work
    (main turns it into one line with the install hint and its own exit status)."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def parse_value(value: str) -> Any:
    """A value read as JSON when it parses (numbers, lists), else as the string it is."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are read as JSON when they parse (numbers, lists), else as strings."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise CbsiteError(f"option {pair!r} is not key=value; e.g. -o embedding_dim=32 -o 'over_arch_layer_sizes=[64,1]'")
        key, value = pair.split("=", 1)
        options[key] = parse_value(value)
    return options


def console() -> Any:
    from rich.console import Console

    # Piped output (CI logs, files) gets a wide table rather than rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=200)


def note_stale(root: Path) -> None:
    """One line on stderr when killed or interrupted runs left folders in the archive, naming the command."""
    from cbsite.archive import shown
    from cbsite.leftovers import stale_staging

    try:
        stale = stale_staging(root)
    except OSError:
        return
    if stale:
        n = len(stale)
        print(f"cbsite: {n} unfinished run folder{'s' * (n != 1)} in {shown(root)} left by interrupted runs; "
              f"remove {'them' if n != 1 else 'it'} with: cbsite gc --runs {shown(root)}", file=sys.stderr)


def staging_in(root: Path) -> Any:
    """Plugin artifacts of the runs collected meanwhile are staged in the archive (see archive.py)."""
    from cbsite.archive import staging_dir
    from cbsite.collector.plugins.runner import staging_in as plugin_staging_in

    return plugin_staging_in(staging_dir(root))


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
# zero floor would fail only after a whole session, a negative worker count inside an executor.
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
