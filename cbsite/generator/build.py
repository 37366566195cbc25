"""Archive -> generated MkDocs project -> built site.

1. read the archive (broken runs become warnings), 2. render every page from `templates/` (package data) into a
project's `docs/` and write the browser's data files beside them, 3. `mkdocs build` (strict; the data files
are hard-linked into the site, not copied, see reuse.py), 4. publish the artifacts into the site. The same
archive gives the same bytes: sorted inputs, no clock (SOURCE_DATE_EPOCH is the newest run's time), sorted JSON.
With a build cache (cache.py), only what changed is computed, rendered and converted; the rest comes from
the cache and the previous site (reuse.py), and the site is the same.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings as pywarnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import jinja2

from cbsite import archive, stats, throughput
from cbsite.archive import Run
from cbsite.diff.record import LABELS
from cbsite.errors import CbsiteError
from cbsite.generator import cache as bcache
from cbsite.generator import (
    charts,
    historydata,
    jobs,
    precompress,
    regressionsdata,
    rundata,
    searchpaths,
    sitedir,
    studydata,
    templating,
)
from cbsite.generator.catalog import Catalog, load_catalog
from cbsite.generator.config import SiteConfig, dump_yaml, load_site_config, project_config

ASSETS_DIR = "assets/cbsite"
MAX_NEWEST = 10


class SiteWarning(UserWarning):
    """A run or setting the build had to skip or change; the build still completes."""


@dataclass
class BuildResult:
    site: Path
    project: Path | None
    warnings: list[str] = field(default_factory=list)
    pages: int = 0
    runs: int = 0  # runs on the site (0: an empty archive)


@dataclass
class _DiffEntry:
    """What pages need of one diff (the RunDiff itself stays in the worker that computed it)."""

    base: Run
    head: Run
    url: str
    summary: str | None = None
    digest: dict[str, Any] | None = None  # the summary's clauses grouped for the home page (diffdata.change_digest)
    error: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    comparison: dict[str, Any] | None = None  # the comparison record that measured these two runs, if any
    key: str | None = None  # its key in the build cache


def _epoch(created_at: str | None) -> int:
    if not created_at:
        return 0
    try:
        dt = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return int(dt.replace(tzinfo=dt.tzinfo or timezone.utc).timestamp())


@contextlib.contextmanager
def _source_date(epoch: int) -> Iterator[None]:
    """MkDocs stamps the sitemap (and its gzip header) with the build date unless SOURCE_DATE_EPOCH is set."""
    old = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(epoch)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = old


class _Writer:
    """Renders templates into the project's docs folder, counts pages and keeps each page's key.

    A page's key (cache builds only) says when its HTML can be taken from the previous site (reuse.py): run
    and diff pages are keyed by their inputs (`key=`), so an unchanged one is not even rendered (a stub
    stands in for it until `render_deferred`); the few other pages by the hash of their Markdown.
    """

    def __init__(self, docs: Path, env: jinja2.Environment, previous: dict[str, str] | None = None) -> None:
        self.docs, self.env, self.pages = docs, env, 0
        self.previous = previous  # page -> key in the previous site; None: no cache, no keys
        self.keys: dict[str, str] = {}
        self.deferred: dict[str, tuple[str, str, dict[str, Any]]] = {}

    def page(self, url: str, template: str, key: str | None = None, **context: Any) -> None:
        target = self.docs / url / "index.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        self.pages += 1
        src = url + "index.md"
        if self.previous is not None and key is not None:
            self.keys[src] = "in:" + key
            if self.previous.get(src) == self.keys[src]:
                self.deferred[src] = (url, template, context)
                target.write_text("")  # MkDocs takes this page from the previous site
                return
        text = self._text(url, template, context)
        target.write_text(text)
        if self.previous is not None and key is None:
            self.keys[src] = "md:" + hashlib.sha256(text.encode()).hexdigest()

    def _text(self, url: str, template: str, context: dict[str, Any]) -> str:
        root = templating.root_of(url)
        return self.env.get_template(template).render(root=root, url=url, assets=root + ASSETS_DIR + "/", **context)

    def render_deferred(self, keep: set[str]) -> None:
        """Render the pages left as stubs but those in `keep`: the previous site cannot lend them after all."""
        for src, (url, template, context) in sorted(self.deferred.items()):
            if src not in keep:
                (self.docs / src).write_text(self._text(url, template, context))
        self.deferred.clear()

    def reusable(self) -> set[str]:
        """The pages whose key is the one the previous site was built with."""
        prev = self.previous or {}
        return {src for src, key in self.keys.items() if prev.get(src) == key}


def _page_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _start_diffs(catalog: Catalog, docs: Path, plan: jobs.Jobs, cache: bcache.BuildCache | None = None,
                 keys: dict[str, str] | None = None) -> tuple[list[_DiffEntry], Callable[[], list[Any]]]:
    consecutive: set[tuple[str, str]] = set()
    for m in catalog.models.values():
        newest = [m.newest(v) for v in m.versions]
        consecutive.update((a.run_id, b.run_id) for a, b in zip(newest, newest[1:]))
    entries = [
        _DiffEntry(base, head, templating.diff_url(base, head, (base.run_id, head.run_id) in consecutive))
        for base, head in catalog.diff_pairs
    ]
    for e in entries:
        e.comparison = catalog.comparison_of.get((e.base.run_id, e.head.run_id))
    diff_jobs = [(e.base.path, e.head.path, docs / e.url, e.head.model, e.comparison) for e in entries]
    for job in diff_jobs:
        job[2].mkdir(parents=True, exist_ok=True)
    if cache is None or keys is None:
        return entries, plan.add("diff", diff_jobs, lambda job: jobs.diff_job(job))
    # Cached diffs are placed now; only the others go to the workers.
    dkeys = [bcache.diff_key(keys[e.base.run_id], keys[e.head.run_id], e.comparison) for e in entries]
    for e, k in zip(entries, dkeys):
        e.key = k
    cached = [cache.load("diffs", k, job[2]) for k, job in zip(dkeys, diff_jobs)]
    todo = [i for i, hit in enumerate(cached) if hit is None]
    wait = plan.add("diff", [diff_jobs[i] for i in todo], lambda job: jobs.diff_job(job))

    def collect() -> list[Any]:
        for i, result in zip(todo, wait()):
            cached[i] = result
            cache.store("diffs", dkeys[i], result, diff_jobs[i][2], bcache.DIFF_FILES)
        return cached

    return entries, collect


def _render_diffs(entries: list[_DiffEntry], results: list[Any], writer: _Writer, warnings: list[str]) -> list[_DiffEntry]:
    for entry, result in zip(entries, results):
        if "error" in result:
            entry.error = result["error"]
            warnings.append(f"diff {entry.base.model}@{entry.base.version} .. {entry.head.model}@{entry.head.version}: {entry.error}")
        else:
            entry.summary, entry.digest = result["summary"], result["digest"]
            entry.context = {**result, "labels": LABELS}
        # Its inputs: the diff (its key covers both runs and the comparison record) and where the page lies.
        key = _page_key("diff", entry.key, entry.url, templating.run_url(entry.head)) if entry.key else None
        writer.page(entry.url, "pages/diff.md.j2", key, base=entry.base, head=entry.head, entry=entry, **entry.context)
    return entries


def _comparisons_by_model(catalog: Catalog, diffs: list[_DiffEntry]) -> dict[str, list[dict[str, Any]]]:
    """Per model, the comparison records (`cbsite compare`) of its runs, newest first, each with its diff page."""
    by_pair = {(e.base.run_id, e.head.run_id): e for e in diffs}
    out: dict[str, list[dict[str, Any]]] = {}
    for record in reversed(catalog.comparisons):
        entry = by_pair.get((record["base"]["run_id"], record["head"]["run_id"]))
        if entry is None:
            continue
        summary = s if isinstance(s := record.get("summary"), dict) else {}
        verdicts = v if isinstance(v := summary.get("verdicts"), dict) else {}
        item = {"id": record.get("comparison_id"), "created_at": record.get("created_at"), "entry": entry,
                "layout": record.get("layout"), "processes": record.get("processes"), "threads": record.get("threads"),
                "counts": {k: verdicts[k] for k in stats.VERDICTS if isinstance(verdicts.get(k), int) and verdicts[k]},
                "noise": summary.get("noise_median"), "detectable": summary.get("detectable_median")}
        for model in sorted({entry.base.model, entry.head.model}):
            out.setdefault(model, []).append(item)
    return out


@dataclass
class _Early:
    """Artifacts published by the run jobs (in the workers, beside the rest of a run's work) into `root`, a
    folder beside the site, and moved into the site once MkDocs has built it (a build without a cache);
    `found`: run id -> what publishing it reported. `ahead`: the data files' gzip copies, made by the workers
    while this process renders the pages (precompress.Ahead), under `root` too."""

    root: Path
    found: dict[str, list[str]] = field(default_factory=dict)
    ahead: precompress.Ahead | None = None


def _render(catalog: Catalog, site: SiteConfig, docs: Path, warnings: list[str],
            cache: bcache.BuildCache | None = None, writer: _Writer | None = None,
            pool: jobs.Pool | None = None, early: _Early | None = None,
            search: searchpaths.ComponentSearch | None = None) -> tuple[int, list[Any]]:
    writer = writer or _Writer(docs, templating.environment())
    totals: dict[str, dict[str, dict[str, Any]]] = {}
    run_info: dict[str, rundata.RunData] = {}
    keys = {run.run_id: cache.key_of(run) for run in catalog.runs()} if cache is not None else None
    with contextlib.ExitStack() as stack:
        plan = jobs.Jobs(stack, {str(run.path): i for i, run in enumerate(catalog.runs())}, pool)
        hits: dict[str, Any] = {}
        for run in catalog.runs():
            url = templating.run_url(run)
            hit = cache.load("runs", keys[run.run_id], docs / url) if cache is not None and keys is not None else None
            if hit is not None:
                hits[run.run_id] = hit
                assert run.path is not None
                shutil.copyfile(run.path / archive.COMPONENTS_FILE, docs / url / archive.COMPONENTS_FILE)
        todo = [run for run in catalog.runs() if run.run_id not in hits]
        for run in todo:
            assert run.path is not None
        by_path = {str(run.path): run for run in todo}
        computed = plan.add("run", [(run.path, docs / templating.run_url(run),
                                     early.root / templating.run_url(run) if early is not None else None) for run in todo],
                            lambda job: jobs.run_job(job, by_path[str(job[0])]))
        entries, diff_results = _start_diffs(catalog, docs, plan, cache, keys)
        plan.start()  # the workers compute; this process waits for them
        # Meanwhile this process writes each model's component history (read from the archive, not the pages' data).
        for name, entry in catalog.models.items():
            historydata.write(_history(cache, name, [entry.newest(v) for v in entry.versions]),
                              docs / templating.model_url(name) / historydata.FOLDER)
        fresh = dict(zip((run.run_id for run in todo), computed()))
        for run in catalog.runs():  # in the catalog's order, whichever process computed what
            value = hits.get(run.run_id) or fresh[run.run_id]
            if early is not None and "published" in value:
                early.found[run.run_id] = value.pop("published")
            rd = dataclasses.replace(value["rd"], run=run)
            warnings.extend(value["warnings"])
            if run.run_id in fresh and cache is not None and keys is not None:
                cache.store("runs", keys[run.run_id], value, docs / templating.run_url(run), bcache.RUN_FILES)
            totals[run.run_id] = rd.totals
            run_info[run.run_id] = rd
        results = diff_results()
        if early is not None and early.ahead is not None and pool is not None:
            early.ahead.start(pool.running(), docs, [templating.run_url(r) for r in catalog.runs()] + [e.url for e in entries])
    diffs = _render_diffs(entries, results, writer, warnings)
    diffs_of: dict[str, list[_DiffEntry]] = {}
    for e in diffs:
        for model in sorted({e.base.model, e.head.model}):
            diffs_of.setdefault(model, []).append(e)
    # The newest run of each version stands for it in search: its page's entries rank first, and each component
    # path of the model gets one entry, on the newest such run that has it (searchpaths.py).
    newest_of_version = {m.newest(v).run_id for m in catalog.models.values() for v in m.versions}
    if search is not None:
        paths_of = {run_id: run_info[run_id].paths for run_id in newest_of_version}
        by_run = searchpaths.assign(([m.newest(v) for v in m.versions], paths_of) for m in catalog.models.values())
        search.pages.update({templating.run_url(run) + "index.md": by_run[run.run_id]
                             for run in catalog.runs() if run.run_id in by_run})
    for run in catalog.runs():
        url = templating.run_url(run)
        related = [e for e in diffs_of.get(run.model, []) if run.run_id in (e.base.run_id, e.head.run_id)]
        # Its inputs: the run (its key covers its files and cbsite's code and templates) and what the page shows
        # of its diffs. Every value passed to the template must be in the key: an unchanged key is not rendered.
        key = _page_key("run", keys[run.run_id], url, [(e.url, e.base.version, e.head.version) for e in related],
                        site.perfetto_origin, run.run_id in newest_of_version) if keys is not None else None
        writer.page(url, "pages/run.md.j2", key, run=run, rd=run_info[run.run_id], meta=run.meta, diffs=related,
                    perfetto_origin=site.perfetto_origin, search_boost=run.run_id in newest_of_version)
    comparisons_of = _comparisons_by_model(catalog, diffs)
    for name, entry in catalog.models.items():
        url = templating.model_url(name)
        newest_ids = {entry.newest(v).run_id for v in entry.versions}
        model_runs = entry.all_runs()
        specs = _trend_specs(cache, entry.versions, model_runs, newest_ids, totals)
        templating.dump_json(specs, docs / url / "trends.json")
        writer.page(url, "pages/model.md.j2", model=entry, totals=totals, chart_metrics=list(specs),
                    chart_titles=dict(charts.TREND_METRICS + charts.STEP_METRICS), diffs=diffs_of.get(name, []),
                    steps={r.run_id: {m: throughput.mode_of(r.meta, m) for m in throughput.MODES} for r in model_runs},
                    comparisons=comparisons_of.get(name, []))
        writer.page(url + historydata.FOLDER + "/", "pages/history.md.j2", model=entry)
    regressions = regressionsdata.index(diffs)
    writer.page("regressions/", "pages/regressions.md.j2", **regressions)
    newest = sorted(catalog.runs(), key=lambda r: r.run_id, reverse=True)[:MAX_NEWEST]
    latest_change = {}
    for e in diffs:  # the last consecutive diff of each model is "what changed most" on the home page
        if e.base.model == e.head.model and e.url.startswith("diffs/" + e.head.model + "/"):
            latest_change[e.head.model] = e
    # Models whose newest diff judged a latency regression first: the home page answers "what got slower" first.
    latest_change = dict(sorted(latest_change.items(), key=lambda kv: (not (kv[1].digest or {}).get("regressed"), kv[0])))
    writer.page("", "pages/home.md.j2", catalog=catalog, newest=newest, latest_change=latest_change,
                totals=totals, warnings=warnings, regressions=regressions)
    studies = studydata.render(studydata.find_studies(catalog.runs()), docs, writer, templating.dump_json)
    nav: list[Any] = [{"Home": "index.md"}]
    if catalog.models:
        nav.append({"Models": [{name: f"models/{name}/index.md"} for name in catalog.models]})
    if studies:
        nav.append({"Studies": studies})
    return writer.pages, nav


def _history(cache: bcache.BuildCache | None, model: str, newest: list[Run]) -> dict[str, str]:
    """The model's history files (historydata.py), kept in the cache by the keys of the runs they are read from:
    any of them changed, added or gone computes them again."""
    if cache is None:
        return historydata.model_history(model, newest)
    inputs = [model, [[r.version, r.run_id, cache.key_of(r)] for r in newest]]
    return cache.memo("history", inputs, lambda: historydata.model_history(model, newest))


def _trend_specs(cache: bcache.BuildCache | None, versions: list[str], runs: list[Run], newest_ids: set[str],
                 totals: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The model's trend charts (totals, then step throughput), kept in the cache by their inputs (Altair takes
    a quarter of a second a model): the runs' keys cover their totals and step records."""
    def compute() -> dict[str, Any]:
        return {**charts.trend_specs(versions, runs, newest_ids, totals), **charts.step_trend_specs(versions, runs, newest_ids)}

    if cache is None:
        return compute()
    inputs = [versions, [[r.version, r.run_id, cache.key_of(r)] for r in runs], sorted(newest_ids)]
    return cache.memo("trends", inputs, compute)


def render_docs(catalog: Catalog, site: SiteConfig, docs: Path, warnings: list[str],
                cache: bcache.BuildCache | None = None, writer: _Writer | None = None,
                pool: jobs.Pool | None = None, early: _Early | None = None,
                search: searchpaths.ComponentSearch | None = None) -> tuple[int, list[Any]]:
    """The one page generator: every page, its data files and the assets, into `docs` (a folder of Markdown
    pages whose links are relative to it). `cbsite build` makes it a project's docs_dir; the MkDocs plugin
    (plugin.py) puts it under a prefix of a team's own docs. With a `cache` (cache.py), runs and diffs whose
    content the cache knows are not computed again. `search` receives the component paths each run page's
    search entries list (searchpaths.py: they go into the index, not into the pages). Returns the number of
    pages and the nav."""
    n_pages, nav = _render(catalog, site, docs, warnings, cache, writer, pool, early, search)
    _write_assets(docs, cache)
    return n_pages, nav


def _write_assets(docs: Path, cache: bcache.BuildCache | None = None) -> None:
    target = docs / ASSETS_DIR
    target.mkdir(parents=True, exist_ok=True)
    for src in sorted((templating.TEMPLATES / "assets").iterdir()):
        if src.is_file():
            shutil.copyfile(src, target / src.name)
    # The chart bundles take a second or more to build in each new process: a cached build keeps them.
    bundles = cache.memo("vega", charts.bundle_versions(), charts.bundles) if cache is not None else charts.bundles()
    for name, script in bundles.items():
        (target / name).write_text(script)


def _mkdocs_build(project: Path, out: Path, strict: bool, quiet: bool, epoch: int, plugin: Any = None,
                  search: searchpaths.ComponentSearch | None = None) -> None:
    """`mkdocs build` of the generated project; with `plugin` (reuse.ReusePlugin) a partial build that takes
    unchanged pages from the previous site; with `search`, the component paths' search entries added."""
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort, ConfigurationError

    logger = logging.getLogger("mkdocs")
    old_level = logger.level
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        with _source_date(epoch):
            cfg = load_config(config_file=str(project / "mkdocs.yml"), site_dir=str(out), strict=strict)
            if search is not None:
                cfg.plugins["cbsite-search-paths"] = searchpaths.ComponentSearchPlugin(search)
            if plugin is None:
                mkdocs_build(cfg)
            else:
                from cbsite.generator import reuse

                cfg.plugins["cbsite-reuse"] = plugin  # registered after search: sees each page's new entries
                quiet_dirty = reuse.drop_dirty_warning()
                try:
                    mkdocs_build(cfg, dirty=True)
                finally:
                    reuse.keep_dirty_warning(quiet_dirty)
    except ConfigurationError as exc:
        raise CbsiteError(f"the MkDocs configuration is invalid: {exc}; fix the base mkdocs.yml") from exc
    except Abort as exc:
        raise CbsiteError(f"mkdocs build failed: {exc} (see the warnings above)") from exc
    finally:
        logger.setLevel(old_level)


def build(
    runs: Path, out: Path, *, config: Path | None = None, perfetto_origin: str = "https://ui.perfetto.dev",
    extra_diffs: Sequence[tuple[str, str]] = (), strict: bool = True, quiet: bool = False,
    versioned: bool = False, project_dir: Path | None = None, allow_empty: bool = False, cache: Path | None = None,
) -> BuildResult:
    """Build the site for the archive `runs` into `out`; keep the generated project in `project_dir` if given.

    `cache`: a folder kept between builds (cache.py): runs and diffs whose content it knows are not computed
    again, so adding a run to a big archive computes that run and its diffs only; the site is the same.
    None builds without one; `cache.default_cache_dir(out)` is the command line's default, and is skipped with
    a warning where it cannot serve.

    The site is built beside `out` and swapped in when complete, under a lock (see sitedir.py): a failed or
    killed build leaves the old site whole. An archive with no readable run does not replace an existing
    site unless `allow_empty`.
    """
    # Absolute: mkdocs resolves a relative site_dir against the generated project, not the caller.
    runs, out = Path(runs).resolve(), Path(out).resolve()
    sitedir.check_out(out, runs)
    # The cache removes what it no longer uses: never the archive, the site or the project (cache.py).
    protect = {"the archive": runs, "the site": out, "the generated project": project_dir}
    default_cache = bcache.is_default(cache, out)
    if cache is not None and not default_cache:  # a named cache in the wrong place fails before the lock
        bcache.check_place(Path(cache), protect)
    site = load_site_config(Path(config) if config is not None else None, perfetto_origin)
    with sitedir.locked(out), contextlib.ExitStack() as workers:
        sitedir.check_out(out, runs)  # as found once the lock is held
        store, notes = _open_cache(cache, protect, default_cache)
        pool = jobs.Pool(workers)  # started by the first step that has enough to do: reading the runs, or computing
        # Without a cache, the workers read and check the runs; with one, its memo knows most of them unread.
        catalog = load_catalog(runs, extra_diffs, store.read_run if store is not None else archive.read_run,
                               read_many=(lambda paths: jobs.read_checked(pool, paths)) if store is None else None)
        if not catalog.runs() and sitedir.holds_files(out) and not allow_empty:
            raise CbsiteError(empty_archive_message(runs, out, catalog.warnings))
        with sitedir.staged(out) as stage:
            previous = out if store is not None and sitedir.marker_kind(out) == sitedir.SITE else None
            result = _build_into(catalog, site, stage, strict=strict, quiet=quiet, versioned=versioned,
                                 project_dir=project_dir, cache=store, previous=previous, pool=pool)
        if store is not None:  # the new site is in place: the next build may link from it
            store.record_site(out, store.site_runs, store.site_pages, store.site_global)
            store.save_memo()
            store.prune()
            result.warnings.extend(store.warnings())  # said, never written into the site: it is the same
        result.warnings.extend(notes)
    for w in result.warnings:
        pywarnings.warn(w, SiteWarning, stacklevel=3)
    return BuildResult(site=out, project=project_dir, warnings=result.warnings, pages=result.pages, runs=result.runs)


def _open_cache(cache: Path | None, protect: dict[str, Path | None],
                default: bool) -> tuple[bcache.BuildCache | None, list[str]]:
    """The build cache and what to say about it. The default cache is the user's choice only by omission: where
    it cannot serve (not cbsite's folder, inside the archive or site, not writable) the build goes without it."""
    if cache is None:
        return None, []
    try:
        return bcache.BuildCache(Path(cache), protect), []
    except (CbsiteError, OSError) as exc:
        if not default:
            raise
        return None, [f"the default build cache {cache} was not used ({exc}); the site was built without a cache"]


def empty_archive_message(runs: Path, out: Path, warnings: Sequence[str], flag: str = "--allow-empty") -> str:
    what = "does not exist" if not runs.exists() else ("has no readable run" if warnings else "holds no run")
    skipped = f" ({len(warnings)} run{'s' * (len(warnings) != 1)} skipped: {warnings[0]})" if warnings else ""
    return (f"the archive {runs} {what}{skipped}, and building would replace the site in {out} with an empty one; "
            f"check --runs, or pass {flag} to do it anyway")


def _build_into(catalog: Catalog, site: SiteConfig, out: Path, *, strict: bool, quiet: bool, versioned: bool,
                project_dir: Path | None, cache: bcache.BuildCache | None = None,
                previous: Path | None = None, pool: jobs.Pool | None = None) -> BuildResult:
    # Without a cache, the run jobs publish the artifacts too (beside the site: the same file system, so they
    # are moved in, not copied); with one, unchanged runs' artifacts are linked from the previous site instead.
    # Named after the stage folder (`.<site>.cbsite-build-…-artifacts-…`), so a build killed before its `finally`
    # leaves nothing the next build's sitedir.recover does not remove with the stage folder.
    early = _Early(Path(tempfile.mkdtemp(dir=out.parent, prefix=f"{out.name}-artifacts-"))) if cache is None else None
    if early is not None:
        early.ahead = precompress.Ahead(early.root / "gz")
    try:
        return _build_stage(catalog, site, out, strict=strict, quiet=quiet, versioned=versioned,
                            project_dir=project_dir, cache=cache, previous=previous, pool=pool, early=early)
    finally:
        if early is not None:
            sitedir.remove_tree(early.root)


def _build_stage(catalog: Catalog, site: SiteConfig, out: Path, *, strict: bool, quiet: bool, versioned: bool,
                 project_dir: Path | None, cache: bcache.BuildCache | None, previous: Path | None,
                 pool: jobs.Pool | None, early: _Early | None) -> BuildResult:
    warnings = list(catalog.warnings)
    record = cache.previous_site(previous) if cache is not None and previous is not None else {}
    with contextlib.ExitStack() as stack:
        if project_dir is None:
            project = Path(tempfile.mkdtemp(prefix="cbsite-project-"))
            stack.callback(sitedir.remove_tree, project)
        else:
            project = Path(project_dir)
            if project.exists():
                shutil.rmtree(project)
        docs = project / "docs"
        docs.mkdir(parents=True)
        from cbsite.generator import reuse  # imports MkDocs' plugin base

        # Pages are only reused under the stock plugins (reuse.supported) and the previous site's configuration.
        stock = reuse.supported(project_config(site, [], versioned=versioned)[0]["plugins"])
        can_reuse = cache is not None and stock
        env = templating.environment(str(cache.folder_for("templates")) if cache is not None else None)
        writer = _Writer(docs, env, record.get("pages", {}) if can_reuse else None)
        search = searchpaths.ComponentSearch()
        n_pages, nav = render_docs(catalog, site, docs, warnings, cache, writer, pool, early, search)
        cfg, notes = project_config(site, nav, versioned=versioned)
        warnings.extend(notes)
        text = dump_yaml(cfg)
        (project / "mkdocs.yml").write_text(text)
        plugin = None
        if cache is not None and can_reuse:
            gkey = reuse.global_key(text)
            entries = reuse.previous_entries(previous) if previous is not None and record.get("global") == gkey else None
            if entries is not None:
                search.take_previous(entries)
            reused = writer.reusable() if entries is not None else set()
            reused = {src for src in reused  # a page missing from the previous site is rendered after all
                      if previous is not None and (previous / src.removesuffix("index.md") / "index.html").is_file()}
            writer.render_deferred(keep=reused)
            plugin = reuse.ReusePlugin(docs, previous, reused, entries, cache.folder_for("theme-templates"),
                                       parse_pool=pool.running() if pool is not None else None)
        elif stock:  # every page converted; the temporary docs' files linked, not copied (a kept project's are copied)
            plugin = reuse.ReusePlugin(docs, None, set(), None, link_static=project_dir is None,
                                       parse_pool=pool.running() if pool is not None else None)
        _mkdocs_build(project, out, strict, quiet, _epoch(catalog.newest_run_time()), plugin, search)
        if early is not None and early.ahead is not None:
            early.ahead.wait()  # the copies read the generated docs, which go at the end of this block
    previous_runs = record.get("runs", {})

    def publish(run: Run) -> list[str]:
        found: list[str] = []
        if early is not None and run.run_id in early.found:  # published by its run job: moved in
            src, dest = early.root / templating.run_url(run) / archive.ARTIFACTS_DIR, out / templating.run_url(run) / archive.ARTIFACTS_DIR
            if src.is_dir():
                try:
                    os.rename(src, dest)
                except OSError:
                    shutil.copytree(src, dest, dirs_exist_ok=True)
            return list(early.found[run.run_id])
        if cache is None:
            rundata.copy_artifacts(run, out / templating.run_url(run), found)
            return found
        key, before = cache.key_of(run), previous_runs.get(run.run_id)
        if previous is not None and isinstance(before, dict) and before.get("key") == key and _link_tree(
                previous / templating.run_url(run) / archive.ARTIFACTS_DIR, out / templating.run_url(run) / archive.ARTIFACTS_DIR):
            found = [str(w) for w in before.get("warnings", [])]
        else:
            rundata.copy_artifacts(run, out / templating.run_url(run), found)
        cache.site_runs[run.run_id] = {"key": key, "warnings": found}
        return found

    # Runs are published by a pool of threads: the time goes to file system calls (see sitedir.remove_tree).
    with concurrent.futures.ThreadPoolExecutor(sitedir.IO_THREADS) as io_pool:
        for found in io_pool.map(publish, catalog.runs()):
            warnings.extend(found)
    # For static hosts that serve a file's .gz (and `cbsite serve`): unchanged files take the previous site's copy.
    precompress.write_beside(out, previous, early.ahead if early is not None else None)
    if cache is not None and can_reuse:
        cache.site_pages, cache.site_global = writer.keys, gkey
    return BuildResult(site=out, project=project_dir, warnings=warnings, pages=n_pages, runs=len(catalog.runs()))


def _link_tree(src: Path, dest: Path) -> bool:
    """Hard-link the published artifacts of the previous site into the new one; False (nothing left) where the
    previous site has none there or the file system cannot link."""
    if not src.is_dir() or src.is_symlink():
        return False
    try:
        _link_into(str(src), str(dest))
        return True
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        return False


def _link_into(src: str, dest: str) -> None:
    """What shutil.copytree(src, dest, copy_function=os.link) does, without copying each folder's times and
    mode (three calls a folder, thousands per build); the site's bytes are the same."""
    os.makedirs(dest)
    for entry in os.scandir(src):
        target = os.path.join(dest, entry.name)
        if entry.is_dir(follow_symlinks=False):
            _link_into(entry.path, target)
        elif entry.is_file(follow_symlinks=False):
            os.link(entry.path, target)
        else:  # the published artifacts hold only folders and files; anything else is copied from the run
            raise OSError(f"unexpected entry {entry.path}")
