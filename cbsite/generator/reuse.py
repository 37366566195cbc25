"""Partial MkDocs builds: convert only the pages whose key changed, take the others from the previous site.

MkDocs cannot build part of a site, and converting a page (Markdown, then the theme, then the search
parser) is most of what a cached build of a big archive costs. So `cbsite build --cache` runs MkDocs in
its "dirty" mode with this internal plugin, which decides what is dirty instead of MkDocs' mtime rule:

* a page whose key (build.py: the hash of its inputs or of its Markdown) equals the key the previous site
  was built with, under the same `global_key` (the MkDocs configuration, nav included, and the versions of
  cbsite, MkDocs and the theme), is not converted: its HTML is hard-linked from the previous site (copied
  where the file system cannot link), and its entries of the previous search index are reused;
* every other page is converted as in a full build;
* the generated docs' static files (data files, cbsite's assets) are hard-linked into the site instead of
  copied, so the site shares them with the build cache (a built site is output: nothing writes into it);
* where the build started worker processes, Material's search parse of each converted page runs in them
  (searchparse.py: the same parser, most of MkDocs' time on a big archive, off the one busy core);
* the search index is written in the page order of a full build, from the new entries of the converted
  pages and the reused entries of the others, then the component paths' entries (searchpaths.py, which takes
  a page's previous ones where its paths are the same); the sitemap and 404 page are always built.

So the site is byte for byte the one a full build writes (tests/test_build_cache.py compares them).
Only the stock search plugin (MkDocs' or Material's) is understood; any other plugin may make a page depend
on the whole site, so build.py does not reuse pages when there is one (`supported`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import jinja2
from mkdocs.plugins import BasePlugin, event_priority

from cbsite.errors import CbsiteError
from cbsite.generator import cache as bcache
from cbsite.generator import searchparse, searchpaths

SEARCH_NAMES = ("search", "material/search")
# A cbsite page's body is one raw HTML block, which Markdown only copies; it is held out of Markdown's parser
# (on_page_markdown) and put back after (on_page_content). Only where the block is plain: balanced divs, and no
# element whose content an HTML parser reads differently (scripts, comments, preformatted text).
PAGE_OPEN = '<div class="cbsite-page"'
_HELD = "\ncbsite-held-body-b1e2"  # stands for the held body in the Markdown; a page that has this text keeps it
_DIV = re.compile(r"<div\b|</div>")
_UNPLAIN = re.compile(r"<script|<style|<pre|<textarea|<!--|<\?|<!\[|" + _HELD.strip())


def _hold(markdown: str) -> tuple[int, int] | None:
    """Where the body of the page's cbsite-page div lies (from the end of its opening line to the line of its
    closing tag), or None where it is not plain enough to be left out of Markdown."""
    open_at = 0 if markdown.startswith(PAGE_OPEN) else markdown.find("\n" + PAGE_OPEN)
    if open_at < 0 or _HELD.strip() in markdown:
        return None
    start = markdown.find("\n", open_at + 1)
    if start < 0:
        return None
    depth = 1
    for m in _DIV.finditer(markdown, start):
        depth += 1 if m.group() == "<div" else -1
        if depth == 0:
            end = m.start()
            if markdown[end - 1] != "\n" or _UNPLAIN.search(markdown, start, end):
                return None
            return start, end - 1  # the held text runs from the newline after the opening tag to the one before </div>
    return None


_DIRTY_WARNING = "A 'dirty' build is being performed"


def supported(plugins: list[Any]) -> bool:
    """Pages can be reused under this configuration's plugins: the stock search plugin and nothing else."""
    names = [p if isinstance(p, str) else next(iter(p), "") for p in plugins]
    return all(n in SEARCH_NAMES for n in names)


def global_key(mkdocs_yml: str) -> str:
    """What every page's HTML depends on besides its own Markdown: the configuration (nav included), cbsite's
    code and templates, and the versions of what converts and renders pages."""
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    # What converts Markdown and renders the theme, besides cbsite itself (in the fingerprint).
    versions = " ".join(version(d) for d in ("mkdocs", "mkdocs-material", "markdown", "pymdown-extensions", "jinja2"))
    return hashlib.sha256(f"{bcache.fingerprint()}\0{versions}\0{mkdocs_yml}".encode()).hexdigest()


def previous_entries(site: Path) -> dict[str, list[dict[str, Any]]] | None:
    """The previous site's search entries grouped by page URL (an entry's location is the page's URL, then
    an optional #anchor); None when there is no readable index."""
    try:
        docs = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for entry in docs:
        out.setdefault(str(entry.get("location", "")).split("#", 1)[0], []).append(entry)
    return out


def link_or_copy(src: Path, dest: Path) -> bool:
    """Hard-link src to dest (copied where the file system cannot link); False when src is missing."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except FileNotFoundError:
        return False
    except OSError:
        shutil.copyfile(src, dest)
    return True


class _DropDirtyWarning(logging.Filter):
    """MkDocs warns on every dirty build (a strict build would fail); here the dirty set is exact."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_DIRTY_WARNING)


class ReusePlugin(BasePlugin):
    """Added by build.py to the generated project's plugins, after search (see the module's docstring)."""

    def __init__(self, docs: Path, previous: Path | None, reuse: set[str],
                 entries: dict[str, list[dict[str, Any]]] | None, bytecode_dir: Path | None = None,
                 link_static: bool = True, parse_pool: concurrent.futures.Executor | None = None) -> None:
        super().__init__()
        # The build's worker processes, if it started them: Material's search parse of each page runs there.
        self.offload = searchparse.Offload(parse_pool) if parse_pool is not None else None
        self.docs, self.previous, self.reuse = docs.resolve(), previous, set(reuse)
        self.link_static = link_static  # False: the generated docs are kept (project_dir), so they are copied
        self.bytecode_dir = bytecode_dir
        self.entries = entries or {}
        self.fresh: dict[str, list[dict[str, Any]]] = {}  # page URL -> the entries its conversion added
        self._seen = 0
        self._files: list[Any] = []
        self._held: dict[str, str] = {}  # page -> its held body

    @event_priority(-100)  # after every other plugin has added or changed files
    def on_files(self, files: Any, *, config: Any) -> Any:
        site = Path(config.site_dir)
        for file in files:
            if file.is_documentation_page():
                if file.src_uri in self.reuse:
                    # build.py checked the page is there; its docs file is a stub, so it must not be converted.
                    if self.previous is None or not link_or_copy(self.previous / file.dest_uri, site / file.dest_uri):
                        raise CbsiteError(f"the previous site lost {file.dest_uri} during the build; build again")
                    file.is_modified = lambda: False
                continue
            src = Path(file.abs_src_path) if file.abs_src_path and self.link_static else None
            if src is not None and self.docs in src.parents and link_or_copy(src, site / file.dest_uri):
                file.is_modified = lambda: False
        return files

    def on_env(self, env: Any, *, config: Any, files: Any) -> Any:
        """The theme's templates compiled once, not in every build's process (half a second for Material)."""
        if self.bytecode_dir is not None:
            env.bytecode_cache = jinja2.FileSystemBytecodeCache(str(self.bytecode_dir))
        return env

    # -- held page bodies: the same HTML and search entries at a fraction of the parsing -----------------------
    def on_page_markdown(self, markdown: str, *, page: Any, config: Any, files: Any) -> str:
        """A cbsite page's body (the inside of its `<div class="cbsite-page">`, one raw HTML block, which
        Markdown copies as it is) is left out of the Markdown: Python-Markdown's HTML parser would spend more
        time finding where that block ends than on everything else of the page."""
        held = _hold(markdown)
        if held is None:
            return markdown
        start, end = held
        inner = markdown[start:end]
        self._held[page.file.src_uri] = inner
        return markdown[:start] + _HELD + markdown[end:]

    def on_page_content(self, html: str, *, page: Any, config: Any, files: Any) -> str:
        """The held body back, before the search plugin reads the page (on_page_context)."""
        held = self._held.pop(page.file.src_uri, None)
        if held is not None:
            if html.count(_HELD) != 1:  # Markdown did not copy the block as it is: convert the page as it was
                page.markdown = page.markdown.replace(_HELD, held)
                page.render(config, files)
                html = page.content
            else:
                html = html.replace(_HELD, held)
        if self.offload is not None:
            self.offload.send(page, html, config)
        return html

    def on_page_context(self, context: Any, *, page: Any, config: Any, nav: Any) -> Any:
        index = searchpaths.search_index(config)
        if index is not None:  # the search plugin (registered before this one) has just added this page's entries
            self.fresh[page.url] = index[self._seen:]  # none where a worker parses the page (searchparse.py)
            self._seen = len(index)
        if self.offload is not None:
            self.offload.restore(page)
        return context

    @event_priority(100)  # before the search plugin writes its index
    def on_post_build(self, *, config: Any) -> None:
        index = searchpaths.search_index(config)
        if index is None:
            return
        if self.offload is not None:
            self.fresh.update(self.offload.results())
        merged: list[dict[str, Any]] = []
        for file in self._files:
            url = file.page.url if file.page is not None else file.url
            merged.extend(self.fresh.get(url, []) if file.src_uri not in self.reuse else self.entries.get(url, []))
        index[:] = merged

    @event_priority(-100)
    def on_nav(self, nav: Any, *, config: Any, files: Any) -> Any:
        self._files = files.documentation_pages()
        return nav


def drop_dirty_warning() -> logging.Filter:
    flt = _DropDirtyWarning()
    logging.getLogger("mkdocs.commands.build").addFilter(flt)
    return flt


def keep_dirty_warning(flt: logging.Filter) -> None:
    logging.getLogger("mkdocs.commands.build").removeFilter(flt)
