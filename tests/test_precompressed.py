"""Pre-compressed assets for static hosts, and `cbsite serve` as one: the build writes a reproducible `.gz` beside
each larger text file (the Vega bundle, pages, data files), incremental builds keep them right, the server sends
them with `Content-Encoding: gzip` to clients that accept it, and a missing page gets the site's own 404 page."""

from __future__ import annotations

import gzip
import shutil
import urllib.error
import urllib.request
import warnings
from email.message import Message
from pathlib import Path

import pytest

from cbsite.generator import build_site, precompress
from tests.helpers.browser import served
from tests.helpers.site_archives import synthetic_run


def _build(runs: Path, out: Path, cache: Path | None = None) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_site(runs, out, quiet=True, cache=cache)


def _packed(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*.gz")) if "artifacts" not in p.parts}


def _check_copies(site: Path) -> dict[str, bytes]:
    """Every candidate has its copy, every copy (outside the artifacts and MkDocs' sitemap) is its file's bytes."""
    packed = _packed(site)
    ours = {k: v for k, v in packed.items() if k != "sitemap.xml.gz"}
    assert sorted(k.removesuffix(".gz") for k in ours) == precompress.candidates(site)
    for rel, data in ours.items():
        assert gzip.decompress(data) == (site / rel.removesuffix(".gz")).read_bytes(), rel
        assert data[4:8] == b"\0\0\0\0"  # mtime 0: the same archive gives the same bytes
    return ours


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("precompressed") / "runs"
    synthetic_run(runs, "toy", "v1", n=60, seed=11, trace_every=10)
    synthetic_run(runs, "toy", "v2", n=64, seed=12, minutes=5, scale=1.3)
    return runs


@pytest.fixture(scope="module")
def site(archive, tmp_path_factory) -> Path:
    return _build(archive, tmp_path_factory.mktemp("site-a") / "site")


def test_the_bundle_pages_and_data_files_get_a_reproducible_gzip_copy(archive, site, tmp_path):
    ours = _check_copies(site)
    run = next((site / "runs" / "toy" / "v2").iterdir()).relative_to(site).as_posix()
    for rel in ("assets/cbsite/vega.js", "index.html", f"{run}/index.html", f"{run}/components.json", "search/search_index.json"):
        assert rel + ".gz" in ours, rel
    assert len(ours["assets/cbsite/vega.js.gz"]) < (site / "assets/cbsite/vega.js").stat().st_size / 2
    # Small files and the run's published artifacts (traces are gzip files already) get none.
    assert not any(f.stat().st_size < precompress.MIN_BYTES for f in (site / k.removesuffix(".gz") for k in ours))
    traces = [p for p in site.rglob("artifacts/**/*") if p.is_file()]
    assert traces and not any(p.with_name(p.name + ".gz").exists() for p in traces if not p.name.endswith(".gz"))
    assert _packed(_build(archive, tmp_path / "again")) == _packed(site)  # byte for byte


def test_incremental_builds_keep_every_copy_right(tmp_path):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    synthetic_run(runs, "toy", "v1", n=40, seed=1)
    synthetic_run(runs, "toy", "v2", n=40, seed=2, minutes=5)
    site = _build(runs, tmp_path / "site", cache)
    before = _check_copies(site)
    synthetic_run(runs, "toy", "v3", n=44, seed=3, minutes=10, scale=1.2)
    shutil.rmtree(runs / "toy" / "v1")
    grown = _check_copies(_build(runs, tmp_path / "site", cache))
    # Pages that changed (the home page lists v3) have new copies; unchanged run data kept theirs; v1's are gone.
    assert grown["index.html.gz"] != before["index.html.gz"]
    kept = [k for k in grown if k.startswith("runs/toy/v2/") and k.endswith("components.json.gz")]
    assert kept and all(grown[k] == before[k] for k in kept)
    assert not any(k.startswith("runs/toy/v1/") for k in grown)
    assert grown == _check_copies(_build(runs, tmp_path / "fresh"))  # as a build without the cache writes them


def _get(url: str, accept: str | None) -> tuple[int, Message, bytes]:
    """Status, headers (names in any case) and body of a GET that sends `accept` as Accept-Encoding."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": accept} if accept is not None else {})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_serve_sends_the_gzip_copy_to_clients_that_accept_it(site):
    raw = (site / "assets/cbsite/vega.js").read_bytes()
    with served(site) as server:
        url = server.url + "assets/cbsite/vega.js"
        status, headers, body = _get(url, "gzip, deflate, br")
        assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
        assert headers["Content-Type"].startswith("text/javascript") and gzip.decompress(body) == raw
        assert int(headers["Content-Length"]) == len(body) < len(raw) / 2
        for accept in (None, "identity", "gzip;q=0", "br"):  # no gzip asked for: the file as it is
            status, headers, body = _get(url, accept)
            assert status == 200 and "Content-Encoding" not in headers and body == raw, accept
        # A folder's index page, compressed too; a small file has no copy and is sent as it is.
        status, headers, body = _get(server.url, "gzip")
        assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == (site / "index.html").read_bytes()
        small = next(p for p in (site / "assets/cbsite").iterdir() if p.suffix == ".js" and p.stat().st_size < precompress.MIN_BYTES)
        status, headers, body = _get(server.url + f"assets/cbsite/{small.name}", "gzip")
        assert status == 200 and "Content-Encoding" not in headers and body == small.read_bytes()
        # Traces are served as the gzip files they are, never with Content-Encoding (Perfetto reads the file).
        trace = next(p for p in site.rglob("artifacts/**/*.gz"))
        status, headers, body = _get(server.url + trace.relative_to(site).as_posix(), "gzip")
        assert "Content-Encoding" not in headers and body == trace.read_bytes()


def test_serve_answers_a_missing_page_with_the_sites_own_404_page(site):
    page = (site / "404.html").read_bytes()
    assert b"404" in page
    with served(site) as server:
        for path in ("no/such/page/", "runs/toy/v9/", "missing.json"):
            status, headers, body = _get(server.url + path, None)
            assert status == 404 and headers["Content-Type"].startswith("text/html") and body == page, path
        status, _, body = _get(server.url + "assets/cbsite/missing.js", "gzip")
        assert status == 404 and body == page
