"""The command line: verbs over the archive, one module per group of commands (collect, compare, runs, site,
demo). `main` is the entry point; `CbsiteError` is caught here, once, and printed as one line. The exit codes are
documented in docs/exit-codes.md."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Any, Iterator, Sequence

from cbsite.cli import collect, common, compare, completion, demo, runs, site
from cbsite.errors import CbsiteError

USAGE_ERROR = 2
INTERNAL_ERROR = 3  # exit 1 is "a gate rule is broken" (diff, compare): an uncaught exception must not read as that
MISSING_DEPENDENCY = 4  # an optional package the command needs is not installed: never read as a bug or a regression
BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a reader that stopped reading


class Terminated(KeyboardInterrupt):
    """SIGTERM (CI cancellation, `timeout`, `kill`), raised like Ctrl-C so that every cleanup runs."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def build_parser() -> argparse.ArgumentParser:
    from cbsite import __version__

    verbose, archive = common.verbosity_parent(), common.runs_parent()
    # -q/-v before the command (`cbsite -v collect ...`) or after it: the same parent, so the same actions.
    parser = argparse.ArgumentParser(
        prog="cbsite", formatter_class=common.HelpFormatter, parents=[verbose],
        description="Component-level profiles of PyTorch models, and a versioned offline site of the results.",
        epilog="`cbsite COMMAND --help` shows a command's options; exit codes: 0 done, 1 a gate rule broken, "
               "2 a usage error, 3 an internal error, 4 a missing dependency.")
    parser.add_argument("--version", action="version", version=f"cbsite {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    collect.add_parsers(sub, [verbose, archive])
    compare.add_parsers(sub, [verbose, archive])
    runs.add_parsers(sub, [verbose, archive])
    site.add_parsers(sub, [verbose], archive)
    demo.add_parsers(sub, [verbose, archive])
    completion.add_parsers(sub, [verbose])
    return parser


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The install hint for an optional package that is not installed; None when `exc` is something else (a
    module of cbsite itself, or one that is installed and failed inside)."""
    import importlib.util

    name = (exc.name or "").split(".")[0]
    if not name or name == "cbsite":
        return None
    try:
        if importlib.util.find_spec(name) is not None:
            return None
    except (ImportError, ValueError):
        pass
    return f"{name}, which is not installed; install it with: pip install {_install_target(name)}"


def _install_target(module: str) -> str:
    """`'cbsite[EXTRA]'` where one of cbsite's extras brings `module`'s distribution, else the distribution."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    wanted = module.replace("_", "-").lower()
    try:
        needs = requires("cbsite") or []
    except PackageNotFoundError:
        needs = []
    for need in needs:
        dist = re.split(r"[\s<>=!~;\[]", need, maxsplit=1)[0].lower()
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", need)
        if extra and dist.replace("_", "-") in (wanted, f"{wanted}-python", f"mkdocs-{wanted}"):
            return f"'cbsite[{extra.group(1)}]'"
    return wanted


@contextlib.contextmanager
def third_party_output(level: int) -> Iterator[None]:
    """Below -v, torch's log warnings (also in the worker processes, through TORCH_LOGS) and other packages' Python
    warnings are left out; cbsite's own warnings and every error stay."""
    if level > 0:
        # -v: torch's fake-tensor failure logs too, which cbsite's own fake passes otherwise keep off the terminal
        # (counting.quiet_fake_tensors reads cbsite's logger level).
        ours = logging.getLogger("cbsite")
        previous = ours.level
        ours.setLevel(logging.DEBUG)
        try:
            yield
        finally:
            ours.setLevel(previous)
        return
    set_env = "TORCH_LOGS" not in os.environ
    if set_env:
        os.environ["TORCH_LOGS"] = "-torch"  # torch's loggers at ERROR in every process started from here
    torch_log = logging.getLogger("torch")
    before = torch_log.level
    torch_log.setLevel(logging.ERROR)  # where torch is already imported
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(?!cbsite)")
            yield
    finally:
        if set_env:
            os.environ.pop("TORCH_LOGS", None)
        torch_log.setLevel(before or logging.WARNING)  # torch's own default once it is imported


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:  # the console script: a shell's TAB is answered here, and the process ends
        completion.complete(parser)
    args = parser.parse_args(argv)
    # Only the main thread may set handlers (main() called from a worker thread keeps the default).
    installed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if installed else None
    try:
        common.check_numbers(args)
        with third_party_output(common.verbosity(args)):
            return args.func(args)
    except CbsiteError as exc:
        print(f"cbsite: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Terminated:
        print("cbsite: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("cbsite: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`cbsite ls | head`): no traceback, the shell's SIGPIPE status
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - a bug: its traceback, and an exit status CI cannot read as "regressed" (1)
        hint = missing_dependency(exc) if isinstance(exc, ModuleNotFoundError) else None
        if hint is not None:
            print(f"cbsite: error: cbsite {args.command} needs {hint}", file=sys.stderr)
            return MISSING_DEPENDENCY
        import traceback

        traceback.print_exc()
        print(f"cbsite: internal error (a bug in cbsite or a plugin, not a regression); exit {INTERNAL_ERROR}",
              file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def run() -> None:
    """The `cbsite` console script. A failing command leaves at once once its output is flushed: after an error,
    interpreter shutdown with polars' and pyarrow's threads alive aborted 1 time in 20 ("terminate called without an
    active exception", exit 134 instead of 2; pola-rs/polars#24169, apache/arrow#34314). A success exits normally."""
    rc = main()
    if rc:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


def entrypoint(*argv: str) -> None:
    """`cbsite collect ARGV --distributed` for torch.distributed.elastic's launcher (`elastic_launch(config,
    entrypoint)(*argv)`); a non-zero exit raises SystemExit so the launcher records the rank as failed."""
    rc = main(["collect", *argv, *([] if "--distributed" in argv else ["--distributed"])])
    if rc:
        raise SystemExit(rc)
