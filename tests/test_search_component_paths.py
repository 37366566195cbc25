"""Search entries for component paths: one per distinct path of a model, on the newest version's run page that
has that path, in the built site's search index (not in the pages' HTML); a build with the cache writes the
same index as a full build when a newer run takes over paths an older one held."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from cbsite.generator import build_site
from tests.helpers.runfactory import make_run, write_archive

V1 = {"": {"emb": {"emb.t_cat_0": None, "emb.t_cat_1": None}, "mlp": {"mlp.0": None}}}
V2 = {"": {"emb": {"emb.t_cat_0": None}, "mlp": {"mlp.0": None, "mlp.1": None}}}  # t_cat_1 gone, mlp.1 new
OTHER = {"": {"emb": {"emb.t_cat_0": None}}}  # another model with a path of the same name


def _archive(runs: Path) -> dict[str, str]:
    """toy v1 (two runs), toy v2, other v1; returns the run page folder of each by a short name."""
    made = {
        "toy v1 old": make_run(V1, model="toy", version="v1", run_id="20250101T000000Z-000001"),
        "toy v1": make_run(V1, model="toy", version="v1", run_id="20250101T000100Z-000002"),
        "toy v2": make_run(V2, model="toy", version="v2", run_id="20250101T000200Z-000003"),
        "other v1": make_run(OTHER, model="other", version="v1", run_id="20250101T000300Z-000004"),
    }
    write_archive(runs, made.values())
    return {k: f"runs/{r.model}/{r.version}/{r.run_id}/" for k, r in made.items()}


def _build(runs: Path, out: Path, cache: Path | None = None) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(runs, out, quiet=True, cache=cache)
    return json.loads((out / "search" / "search_index.json").read_text())


def _component_entries(index: dict) -> dict[str, list[str]]:
    """Run page -> the paths its component entries are titled with, in index order."""
    out: dict[str, list[str]] = {}
    for d in index["docs"]:
        if "#find=" in d["location"]:
            page, path = d["location"].split("#find=", 1)
            assert d["title"] == path  # titled by the whole path, addressed by it
            out.setdefault(page, []).append(d["title"])
    return out


def test_each_path_of_a_model_has_one_entry_on_the_newest_run_that_has_it(tmp_path):
    runs = tmp_path / "runs"
    pages = _archive(runs)
    index = _build(runs, tmp_path / "site")
    found = _component_entries(index)
    assert found == {
        pages["toy v2"]: ["emb", "emb.t_cat_0", "mlp", "mlp.0", "mlp.1"],
        pages["toy v1"]: ["emb.t_cat_1"],  # gone in v2: found on the newest run that has it
        pages["other v1"]: ["emb", "emb.t_cat_0"],  # each model's paths are its own
    }
    # A component entry shows its path and holds the path's tails, so that a middle part of the path finds it;
    # it follows its page's own entry (Material groups a page's sections under the page that comes first).
    entry = next(d for d in index["docs"] if d["location"] == pages["toy v1"] + "#find=emb.t_cat_1")
    assert entry["text"] == "<p>t_cat_1 cat_1 1</p>"
    order = [d["location"] for d in index["docs"]]
    assert order.index(pages["toy v1"]) < order.index(entry["location"])
    # The run pages do not carry the path list themselves.
    for page in pages.values():
        assert 'id="find=' not in (tmp_path / "site" / page / "index.html").read_text()


def test_a_cached_build_moves_a_path_to_the_newer_run_that_has_it_again(tmp_path):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    pages = _archive(runs)
    _build(runs, tmp_path / "site", cache)
    v3 = make_run(V1, model="toy", version="v3", run_id="20250101T000400Z-000005")  # t_cat_1 is back
    write_archive(runs, [v3])
    cached = _build(runs, tmp_path / "site", cache)
    full = _build(runs, tmp_path / "full")
    assert cached == full
    found = _component_entries(cached)
    v3_page = f"runs/toy/v3/{v3.run_id}/"
    assert found[v3_page] == ["emb", "emb.t_cat_0", "emb.t_cat_1", "mlp", "mlp.0"]
    assert found[pages["toy v2"]] == ["mlp.1"]
    assert pages["toy v1"] not in found
