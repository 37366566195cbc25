"""Publishing into a directory in mike's layout: versions.json, aliases, the root redirect, and isolation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cbsite.errors import CbsiteError
from cbsite.generator import publish_site
from tests.helpers.site_archives import write_golden_archive


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return write_golden_archive(tmp_path_factory.mktemp("pub") / "runs")


def test_publish_two_versions_in_mike_layout(runs, tmp_path):
    out = tmp_path / "published"
    v1 = publish_site(runs, out, "1.0", aliases=["latest"], set_default=True, quiet=True)
    assert v1 == out / "1.0" and (v1 / "index.html").is_file()
    assert json.loads((out / "versions.json").read_text()) == [{"version": "1.0", "title": "1.0", "aliases": ["latest"]}]
    assert (out / "latest" / "index.html").read_bytes() == (v1 / "index.html").read_bytes()
    assert 'content="0; url=latest/"' in (out / "index.html").read_text()
    # The version selector is configured in the published pages (Material reads ../versions.json).
    assert '"provider":"mike"' in (v1 / "index.html").read_text().replace(" ", "")
    before = _digest(v1)

    publish_site(runs, out, "2.0", aliases=["latest"], title="Two", quiet=True)
    assert _digest(v1) == before  # publishing a version never touches another one
    assert json.loads((out / "versions.json").read_text()) == [
        {"version": "2.0", "title": "Two", "aliases": ["latest"]},
        {"version": "1.0", "title": "1.0", "aliases": []},
    ]
    assert (out / "latest" / "index.html").read_bytes() == (out / "2.0" / "index.html").read_bytes()
    assert 'url=latest/' in (out / "index.html").read_text()


def test_republish_is_byte_identical_and_names_are_checked(runs, tmp_path):
    out = tmp_path / "p"
    publish_site(runs, out, "1.0", aliases=["stable"], quiet=True)
    first = _digest(out)
    publish_site(runs, out, "1.0", aliases=["stable"], quiet=True)
    assert _digest(out) == first
    with pytest.raises(CbsiteError, match="already an alias"):
        publish_site(runs, out, "stable", quiet=True)
    with pytest.raises(CbsiteError, match="already a published version"):
        publish_site(runs, out, "2.0", aliases=["1.0"], quiet=True)
    with pytest.raises(CbsiteError, match="invalid site version"):
        publish_site(runs, out, "../escape", quiet=True)
