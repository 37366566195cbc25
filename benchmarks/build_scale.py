"""How `cbsite build` time grows with the number of runs and of components.

Generates synthetic archives (tests/helpers/site_archives.synthetic_run: real archive files, both phases, traces on a
few components), builds each, and prints build time, time per run, page count and the largest page and data
file. Usage:

    .venv/bin/python benchmarks/build_scale.py                 # 10/30/100 runs x 1,000 components + 1 x 10,000
    .venv/bin/python benchmarks/build_scale.py --runs 10 30 --components 1000 --big 10000
    .venv/bin/python benchmarks/build_scale.py --incremental 300   # add one run to 300 runs: no flags vs --no-cache
    .venv/bin/python benchmarks/build_scale.py --bytes 10000       # gzipped bytes of a run and a diff page with data
    .venv/bin/python benchmarks/build_scale.py --runs 100 --big 0 --keep /tmp/scale   # archive and site kept
    .venv/bin/python benchmarks/build_scale.py --runs 1000 --big 0 --shared-paths   # a model's versions share paths

With `--keep DIR` each archive is kept in DIR/runs-<runs>x<components>[-shared] and its site in DIR/site-...; an
archive already there is built again, not generated (to profile or compare builds of the same archive). The CPU
figure is the build process's and its workers'; `main` is the build process's alone.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbsite.generator import build_site
from cbsite.generator.cache import default_cache_dir
from cbsite.generator.charts import bundles
from tests.helpers.site_archives import synthetic_run


def make_archive(root: Path, runs: int, components: int, shared_paths: bool = False) -> float:
    """runs spread over 5 models, versions v1, v2, ... per model; returns the seconds it took. Each run's tree is drawn
    afresh (its paths mostly its own), or with `shared_paths` once per model (every version has the same paths)."""
    t = time.perf_counter()
    for i in range(runs):
        model = f"model{i % 5}"
        synthetic_run(root, model, f"v{i // 5 + 1}", n=components, seed=i + 1, minutes=i, scale=1 + (i % 7) / 10,
                      trace_every=max(components // 20, 1), branching=8,
                      shape_seed=(i % 5) if shared_paths else None)
    return time.perf_counter() - t


def measure(root: Path, out: Path) -> dict[str, float]:
    main = _cpu_main()
    seconds, cpu = timed_build(root, out, None)
    main = _cpu_main() - main
    html = list(out.rglob("*.html"))
    data = list(out.rglob("*.json"))
    return {
        "seconds": seconds,
        "cpu": cpu,
        "main_cpu": main,
        "pages": len(html),
        "largest_page_kb": max(p.stat().st_size for p in html) / 1024,
        "largest_json_kb": max(p.stat().st_size for p in data if "assets" not in p.parts) / 1024,
        "search_index_kb": (out / "search" / "search_index.json").stat().st_size / 1024,
        "site_mb": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6,
    }


def timed_build(root: Path, out: Path, cache: Path | None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process and its worker processes): on a shared machine the CPU time
    says what the build costs whatever the load."""
    t, cpu = time.perf_counter(), _cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(root, out, quiet=True, cache=cache)
    return time.perf_counter() - t, _cpu() - cpu


def _cpu_main() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def incremental(runs: int, components: int, repeat: int = 3) -> None:
    """An archive of `runs` runs built as `cbsite build` builds it with no flags (the default build cache, kept
    here in the temporary folder) and, in the same process, without a cache: the first build (cache cold), then one
    run added (a new version of one model: one run page's data and one diff computed), `repeat` times, then a build
    with nothing added. Ratios: the cached build's time over the full build's, wall and CPU."""
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CBSITE_CACHE_DIR"] = str(Path(tmp) / "user-cache")  # the default cache, not in the user's
        root, out, full_out = Path(tmp) / "runs", Path(tmp) / "site", Path(tmp) / "full"
        cache = default_cache_dir(out)
        gen = make_archive(root, runs, components)
        print(f"archive: {runs} runs x {components:,} components, generated in {gen:.1f} s")
        print(f"{'':34} {'no flags s':>10} {'CPU s':>7} {'--no-cache s':>12} {'CPU s':>7} {'ratio':>6} {'CPU ratio':>9}")

        def row(label: str) -> None:
            load = os.getloadavg()[0]
            inc, inc_cpu = timed_build(root, out, cache)
            full, full_cpu = timed_build(root, full_out, None)
            print(f"{label:34} {inc:10.1f} {inc_cpu:7.1f} {full:12.1f} {full_cpu:7.1f} {inc / full:6.2f} "
                  f"{inc_cpu / full_cpu:9.2f}   (load average before: {load:.2f})")

        row("first build, cache cold")
        for k in range(repeat):  # each a new version of one model: its run page, its diff, the model and home pages
            i = runs + k
            synthetic_run(root, f"model{i % 5}", f"v{i // 5 + 1}", n=components, seed=i + 1, minutes=i,
                          trace_every=max(components // 20, 1), branching=8)
            row(f"one run added ({i + 1} runs)")
        row("nothing added")
        pages = len(list(out.rglob("*.html")))
        print(f"pages: {pages}, cache MB: {sum(p.stat().st_size for p in cache.rglob('*') if p.is_file()) / 1e6:.0f}")
        os.environ.pop("CBSITE_CACHE_DIR")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


# What each page fetches besides its HTML (the templates' data-* attributes); shared assets are counted apart.
RUN_DATA = ("components.json", "roofline.json", "ops.json")
DIFF_DATA = ("diff.json", "diff.forward.json", "charts.json")  # on open; diff.backward.json loads when asked for


def gz_size(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), 6)) if path.is_file() else 0


def shipped_size(path: Path) -> int:
    """What a static host that serves the site's own `.gz` copies sends (a file too small for one: as it is)."""
    packed = path.with_name(path.name + ".gz")
    return packed.stat().st_size if packed.is_file() else path.stat().st_size if path.is_file() else 0


def page_bytes(components: int) -> None:
    """A run page and a diff page of two runs of `components` components: bytes moved with their data, gzipped
    (level 6, what a web server sends), and the shared assets every page loads once (then cached)."""
    with tempfile.TemporaryDirectory() as tmp:
        root, out = Path(tmp) / "runs", Path(tmp) / "site"
        for i in (1, 2):
            synthetic_run(root, "big", f"v{i}", n=components, seed=i, minutes=i, scale=1 + (i - 1) * 0.3,
                          trace_every=max(components // 20, 1), branching=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_site(root, out, quiet=True)
        run_dir = next((out / "runs" / "big" / "v2").iterdir())
        diff_dir = out / "diffs" / "big" / "v1" / "v2"
        run_files = [run_dir / "index.html"] + [run_dir / n for n in RUN_DATA]
        diff_files = [diff_dir / "index.html"] + [diff_dir / n for n in DIFF_DATA]
        assets = sorted((out / "assets" / "cbsite").glob("*.js")) + sorted((out / "assets" / "cbsite").glob("*.css"))
        print(f"{components:,} components, gzipped bytes per page with its data:")
        for label, files in (("run page", run_files), ("diff page", diff_files)):
            parts = ", ".join(f"{f.name} {gz_size(f) / 1e6:.2f}" for f in files if f.is_file())
            print(f"  {label}: {sum(map(gz_size, files)) / 1e6:.2f} MB ({parts}); "
                  f"{sum(map(shipped_size, files)) / 1e6:.2f} MB as the site's own .gz copies")
        print(f"  diff page, loaded when asked for: diff.backward.json {gz_size(diff_dir / 'diff.backward.json') / 1e6:.2f} MB")
        print(f"  shared cbsite assets (once per visit): {sum(map(gz_size, assets)) / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, nargs="+", default=[10, 30, 100])
    ap.add_argument("--components", type=int, default=1000)
    ap.add_argument("--big", type=int, default=10000, help="components of the single big run (0: skip)")
    ap.add_argument("--incremental", type=int, default=0, metavar="N",
                    help="only measure adding one run to an archive of N runs: a build with no flags (the default "
                         "build cache) against a full build without one")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep each archive and its site in DIR (an archive already there is reused)")
    ap.add_argument("--shared-paths", action="store_true",
                    help="every version of a model has the same component paths, as a real model's keep theirs "
                         "(default: each run's tree drawn afresh, so most paths are its own)")
    ap.add_argument("--bytes", type=int, default=0, metavar="N",
                    help="only measure the gzipped bytes of a run page and a diff page at N components")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    t = time.perf_counter()
    bundles()  # built once per process; reported apart so the per-archive figures compare
    print(f"vega bundles (once per process): {time.perf_counter() - t:.1f} s")
    if args.incremental:
        incremental(args.incremental, args.components)
        return
    if args.bytes:
        page_bytes(args.bytes)
        return
    print(f"{'archive':>22} {'generate s':>10} {'build s':>8} {'ms/run':>7} {'pages':>6} {'max page KB':>11} "
          f"{'max data KB':>11} {'search KB':>9} {'site MB':>8}")
    cases = [(n, args.components) for n in args.runs] + ([(1, args.big)] if args.big else [])
    for runs, comps in cases:
        with tempfile.TemporaryDirectory() as tmp:
            where = args.keep if args.keep is not None else Path(tmp)
            kind = f"{runs}x{comps}" + ("-shared" if args.shared_paths else "")
            root, site = where / f"runs-{kind}", where / f"site-{kind}"
            gen = make_archive(root, runs, comps, args.shared_paths) if args.keep is None or not root.is_dir() else 0.0
            load = os.getloadavg()[0]
            r = measure(root, site)
            print(f"{f'{runs} runs x {comps:,}':>22} {gen:10.1f} {r['seconds']:8.1f} {1000 * r['seconds'] / runs:7.0f} "
                  f"{r['pages']:6d} {r['largest_page_kb']:11.0f} {r['largest_json_kb']:11.0f} {r['search_index_kb']:9.0f} "
                  f"{r['site_mb']:8.1f}   ({r['cpu']:.0f} s CPU, {r['main_cpu']:.0f} s of it the main process; "
                  f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)")
            if args.keep is None:
                shutil.rmtree(root)


if __name__ == "__main__":
    main()
