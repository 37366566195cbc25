"""The MkDocs plugin `cbsite`: the archive's pages inside the docs a team already has.

    plugins:
      - search
      - cbsite:
          runs: runs          # the archive, relative to mkdocs.yml
          prefix: perf        # where the pages go: perf/index.md, perf/models/<model>/, perf/runs/..., perf/diffs/...
          nav_title: Performance
          perfetto_origin: https://ui.perfetto.dev
          cache: true         # the default: runs and diffs known by content are not recomputed; the cache lies in
                              # the user's cache directory; or a folder relative to mkdocs.yml; false: no cache

The pages come from the one page generator `cbsite build` uses (build.render_docs), rendered into a
temporary folder and handed to MkDocs as generated files under `prefix/`; their links are relative, so they
work under any prefix. Home, model and study pages get a nav entry (appended to an explicit `nav:` under
`nav_title`, or found by MkDocs' automatic nav); run and diff pages are reached from those pages and are
marked not-in-nav. The team's theme, palette, features, markdown extensions and search settings are left as
they are: cbsite's stylesheet and site-wide script are added to cbsite's own pages only (on_post_page), and
the run artifacts (traces, snapshots, logs) are copied after the build, as `cbsite build` copies them.

Inside a team's site the team's nav stays in charge: the archive's home is listed by its page title, never as a
second "Home", and run and diff pages keep the left nav (their `hide: navigation` suits cbsite's own site
only). The theme's fonts are the team's too: where Material would load them from Google Fonts, the build log
says so once (INFO, so `mkdocs build --strict` still passes) with the setting that keeps the pages offline.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

from mkdocs.config import config_options as c
from mkdocs.config.base import Config
from mkdocs.exceptions import PluginError
from mkdocs.plugins import BasePlugin, CombinedEvent, event_priority
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.utils import get_relative_url

from cbsite import schema
from cbsite.errors import CbsiteError
from cbsite.generator import build, rundata, searchpaths, templating
from cbsite.generator.cache import BuildCache, plugin_cache_dir
from cbsite.generator.catalog import Catalog, load_catalog
from cbsite.generator.config import DEFAULT_PERFETTO_ORIGIN, ORIGIN_RE, SiteConfig

log = logging.getLogger("mkdocs.plugins.cbsite")


class CbsitePluginConfig(Config):
    runs = c.Type(str, default="runs")
    prefix = c.Type(str, default="perf")
    nav_title = c.Type(str, default="Performance")
    perfetto_origin = c.Type(str, default=DEFAULT_PERFETTO_ORIGIN)
    cache = c.Type((str, bool), default=True)


class CbsitePlugin(BasePlugin[CbsitePluginConfig]):
    def __init__(self) -> None:
        self._tmp: Path | None = None
        self._catalog: Catalog | None = None
        self._warnings: list[str] = []
        self._search = searchpaths.ComponentSearch()

    # -- configuration: read the archive, render the pages, add the nav entry ---------------------------------
    def on_config(self, config: Any) -> Any:
        prefix = self.config.prefix.strip("/")
        try:
            for part in prefix.split("/"):
                schema.check_name("cbsite plugin prefix part", part)
        except CbsiteError as exc:
            raise PluginError(f"cbsite: prefix {self.config.prefix!r}: {exc}") from None
        origin = self.config.perfetto_origin.rstrip("/")
        if not ORIGIN_RE.match(origin):
            raise PluginError(f"cbsite: perfetto_origin {origin!r} must look like https://ui.perfetto.dev")
        runs = Path(self.config.runs)
        if not runs.is_absolute():
            runs = Path(config.config_file_path or ".").resolve().parent / runs
        if not runs.is_dir():
            raise PluginError(f"cbsite: the archive {runs} does not exist; set `runs:` relative to mkdocs.yml")
        self._prefix = prefix
        self._catalog = load_catalog(runs.resolve(), ())
        self._warnings = list(self._catalog.warnings)
        self._cleanup()
        self._tmp = Path(tempfile.mkdtemp(prefix="cbsite-plugin-"))
        docs = self._tmp / prefix
        site = SiteConfig(base={}, perfetto_origin=origin, source=None)
        store = self._open_cache(config, runs, prefix)
        self._search = searchpaths.ComponentSearch(prefix=prefix)
        _, nav = build.render_docs(self._catalog, site, docs, self._warnings, store, search=self._search)
        if store is not None:
            store.prune()
            self._warnings.extend(store.warnings())
        for w in self._warnings:  # as `cbsite build`: a broken run is skipped and named, never a failed docs build
            log.info("cbsite: %s", w)
        if config.nav is not None:  # an explicit nav: one section for the archive, at the end
            config.nav.append({self.config.nav_title: _section(nav, prefix)})
        _note_fonts(config)
        return config

    def _open_cache(self, config: Any, runs: Path, prefix: str) -> BuildCache | None:
        """The build cache: the user's cache directory by default (skipped with a note where it cannot serve), a
        folder relative to mkdocs.yml when named (an error where it cannot), none with `cache: false`."""
        option = cast("str | bool", self.config.cache)  # mkdocs checked it against c.Type((str, bool))
        if option is False or option == "":
            return None
        config_file = Path(config.config_file_path or "mkdocs.yml").resolve()
        project = config_file.parent
        where = plugin_cache_dir(config_file, prefix) if option is True else project / option
        # The cache prunes what it no longer uses: never the archive, the site, the docs or the project.
        protect = {"the archive": runs, "the site": Path(config.site_dir), "the docs": Path(config.docs_dir)}
        try:
            return BuildCache(where, protect, "cache:", {"the project": project})
        except (CbsiteError, OSError) as exc:
            if option is not True:
                raise PluginError(f"cbsite: {exc}") from None
            self._warnings.append(f"the default build cache {where} was not used ({exc}); built without a cache")
            return None

    # -- files: the generated pages, data files and assets under the prefix ----------------------------------
    def on_files(self, files: Files, *, config: Any) -> Files:
        assert self._tmp is not None
        taken = {f.src_uri for f in files}
        hidden = (f"{self._prefix}/runs/", f"{self._prefix}/diffs/")
        for path in sorted(p for p in self._tmp.rglob("*") if p.is_file()):
            uri = path.relative_to(self._tmp).as_posix()
            if uri in taken:
                raise PluginError(f"cbsite: the docs already have {uri}; choose another prefix than {self._prefix!r}")
            inclusion = InclusionLevel.NOT_IN_NAV if uri.startswith(hidden) else InclusionLevel.UNDEFINED
            files.append(File(uri, str(self._tmp), config.site_dir, config.use_directory_urls, inclusion=inclusion))
        self._search.locate(files)
        return files

    # -- pages: the team's left nav on every page, cbsite's stylesheet and script on cbsite's pages only --------
    def on_page_markdown(self, markdown: str, *, page: Any, config: Any, files: Files) -> str:
        hide = page.meta.get("hide")
        if page.file.src_uri.startswith(self._prefix + "/") and isinstance(hide, list) and "navigation" in hide:
            # Run and diff pages hide the nav to be wide in cbsite's own site; in a team's site it is the way back.
            page.meta["hide"] = [h for h in hide if h != "navigation"]
        return markdown

    # -- pages: cbsite's stylesheet and site-wide script on cbsite's pages only -------------------------------
    def on_post_page(self, output: str, *, page: Any, config: Any) -> str:
        if not page.file.src_uri.startswith(self._prefix + "/"):
            return output
        assets = f"{self._prefix}/{build.ASSETS_DIR}/"
        css = get_relative_url(assets + "cbsite.css", page.url)
        js = get_relative_url(assets + "site.js", page.url)
        output = output.replace("</head>", f'<link rel="stylesheet" href="{css}">\n</head>', 1)
        return output.replace("</body>", f'<script src="{js}"></script>\n</body>', 1)

    # -- search: each component path of a model once, added to the team's search index (searchpaths.py) ------
    @event_priority(50)  # before the search plugin writes its index
    def _add_search_entries(self, *, config: Any) -> None:
        self._search.add_to(config)

    # -- after the build: the run artifacts, then the temporary pages go --------------------------------------
    def _publish_artifacts(self, *, config: Any) -> None:
        assert self._catalog is not None
        out = Path(config.site_dir) / self._prefix
        warnings: list[str] = []
        for run in self._catalog.runs():
            rundata.copy_artifacts(run, out / templating.run_url(run), warnings)
        for w in warnings:
            log.info("cbsite: %s", w)
        self._cleanup()

    on_post_build = CombinedEvent(_add_search_entries, _publish_artifacts)

    def on_shutdown(self) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


GOOGLE_FONTS_NOTE = (
    "cbsite: theme.font is not false, so every page (cbsite's included) loads its fonts from Google Fonts "
    "(fonts.googleapis.com); set `theme: {font: false}` in mkdocs.yml for pages that work offline with system fonts"
)


def _note_fonts(config: Any) -> None:
    """Say once per build that Material will fetch fonts from Google: the team's theme is theirs to change, but
    the request should not go out unannounced from pages that are otherwise offline."""
    theme = config.theme
    if getattr(theme, "name", None) == "material" and theme.get("font", False) is not False:
        log.info(GOOGLE_FONTS_NOTE)


def _section(nav: list[Any], prefix: str) -> list[Any]:
    """The archive's nav section: the generator's nav under `prefix/`, its home entry listed by the page's own
    title (the team's nav has its own "Home")."""
    return [f"{prefix}/{item['Home']}" if isinstance(item, dict) and list(item) == ["Home"] else _prefixed(item, prefix)
            for item in nav]


def _prefixed(nav: Any, prefix: str) -> Any:
    """The generator's nav (paths relative to its docs folder) with every page path under `prefix/`."""
    if isinstance(nav, str):
        return f"{prefix}/{nav}"
    if isinstance(nav, list):
        return [_prefixed(item, prefix) for item in nav]
    if isinstance(nav, dict):
        return {k: _prefixed(v, prefix) for k, v in nav.items()}
    return nav
