"""`cbsite build` as a docs machine runs it: in a fresh process where torch, torchrec and fbgemm_gpu cannot be
imported. `demo_site` (tests/conftest.py) is built this way, so the tests that read it also hold that the site
builds without torch (tests/test_committed_runs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Importing them fails with ImportError, as on a machine without them. (sys.modules[name] = None would leave None
# entries that libraries probing sys.modules, such as scipy, trip over.)
_WITHOUT_TORCH = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, sys

    class NoTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torch", "torchrec", "fbgemm_gpu"):
                return importlib.machinery.ModuleSpec(name, self)
            return None

        def create_module(self, spec):
            raise ImportError(f"{spec.name} is not installed on this docs machine")

        def exec_module(self, module):
            raise ImportError(module.__name__)

    sys.meta_path.insert(0, NoTorch())
    from cbsite.cli import main
    raise SystemExit(main(["build", *sys.argv[1:]]))
    """
)


def build_without_torch(runs: Path, out: Path, jobs: int) -> None:
    """`cbsite build --runs RUNS --out OUT` (default options) with `jobs` build workers, in a process that cannot
    import torch; run from the repository root, as the suite's in-process builds are. Raises with its stderr if
    the build fails."""
    env = {**os.environ, "CBSITE_BUILD_JOBS": str(jobs)}
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "--runs", str(runs), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"`cbsite build` without torch exited {proc.returncode}: {proc.stderr[-3000:]}")
