"""The site's chart bundles (Vega for the model and study pages) are bundled once and read back by later builds."""

from __future__ import annotations

import vl_convert

from cbsite.generator import charts


def test_a_bundle_is_made_once_kept_in_the_user_cache_and_made_again_when_its_file_is_cut(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSITE_CACHE_DIR", str(tmp_path))
    made = []
    real = vl_convert.javascript_bundle

    def bundling(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundling)
    charts.vega_bundle.cache_clear()  # a new process, as far as the bundle is concerned
    first = charts.vega_bundle()
    assert len(made) == 1 and "window.cbsiteVega" in first
    kept = list((tmp_path / "bundles").iterdir())
    assert [p.read_text(encoding="utf-8") for p in kept] == [first]

    charts.vega_bundle.cache_clear()
    assert charts.vega_bundle() == first and len(made) == 1  # read back, not bundled

    # A file cut short (a full disk, a copy stopped halfway) is never served: it is bundled and written again.
    kept[0].write_text(first[: len(first) // 2], encoding="utf-8")
    charts.vega_bundle.cache_clear()
    assert charts.vega_bundle() == first and len(made) == 2
    assert kept[0].read_text(encoding="utf-8") == first
    charts.vega_bundle.cache_clear()  # later tests bundle in their own cache
