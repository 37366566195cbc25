"""Component paths on a phone (390x844) in Debian's chromium are broken across lines only after a `.` or a `_`,
never inside a name ("over_arch.model.0._m" / "lp.1._line" / "ar" once): read from the drawn line boxes of every
path the home, model, run, sharded run, study, regressions and component history pages print, including the
lists the page's script redraws (a sharded run's rank, the history's heading and matches). The templates' `path`
macro and format.js `pathInto` place the same break points."""

from __future__ import annotations

import pytest

from cbsite.generator.templating import environment
from tests.test_browser_phone import page_urls

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)

# Each drawn path (.cbsite-path): its text and the text of each line it is drawn on, from the boxes of its
# characters (a new line where a character's box starts lower than the previous one's).
LINES = """() => Array.from(document.querySelectorAll('.cbsite-path')).filter(e => e.getClientRects().length).map(e => {
    const lines = [], walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    let top = null;
    for (let n = walk.nextNode(); n; n = walk.nextNode()) for (let i = 0; i < n.data.length; i++) {
      const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
      const box = Array.from(r.getClientRects()).find(b => b.width > 0);
      if (!box) continue;
      if (top === null || box.top > top + 2) lines.push('');
      top = box.top; lines[lines.length - 1] += n.data[i];
    }
    return [e.textContent, lines]; })"""


def _mid_name_breaks(drawn: list) -> list:
    """Paths broken other than after a `.` or a `_` that ends a name's part (a leading `_` stays with its name)."""
    bad = []
    for text, lines in drawn:
        assert "".join(lines) == text, (text, lines)  # every character drawn
        for line in lines[:-1]:
            if not (line.endswith(".") or (line.endswith("_") and len(line) > 1 and line[-2] not in "._")):
                bad.append((text, lines))
    return bad


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")
    if page.locator("#cbsite-run").count():
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    if page.locator("#cbsite-history").count():
        page.wait_for_selector("#cbsite-history[data-shown]", timeout=20000)


@pytest.mark.parametrize("kind", ["home", "model", "run", "sharded run", "study", "regressions", "history"])
def test_paths_break_only_after_a_dot_or_underscore_on_a_phone(committed_site, phone, kind):
    server, built = committed_site
    _open(phone, server.url + page_urls(built)[kind])
    drawn = phone.evaluate(LINES)
    assert drawn, kind  # the page prints paths
    assert _mid_name_breaks(drawn) == []
    if kind in ("home", "run", "regressions", "history"):  # paths long enough to need a second line do get one
        assert any(len(lines) > 1 for _, lines in drawn), drawn
    if kind == "sharded run":  # one rank's lists, drawn by the page's script
        before = phone.locator(".cbsite-fact ol.cbsite-hot").first.inner_text()
        phone.select_option("#cbsite-rank", "1")
        phone.wait_for_function("(t) => document.querySelector('.cbsite-fact ol.cbsite-hot').innerText !== t", arg=before)
        drawn = phone.evaluate(LINES)
        assert any(len(lines) > 1 for _, lines in drawn) and _mid_name_breaks(drawn) == []
    if kind == "history":  # the matches listed as a person types
        phone.fill("#cbsite-history-search", "embedding")
        assert phone.locator("#cbsite-history-matches a").count() > 1
        assert _mid_name_breaks(phone.evaluate(LINES)) == []
    assert phone.errors == []


PATHS = ["", "dlrm", "_mlp", "over_arch.model.0._mlp.1._linear", "t_cat_0", "a__b", "trailing_", "x.",
         "sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0", "a_very_long_name_of_a_module.__dunder_name__"]


def test_template_and_script_place_the_same_break_points(committed_site, phone):
    server, built = committed_site
    _open(phone, server.url + page_urls(built)["history"])
    macro = environment().get_template("pages/_macros.j2").module.path
    script = phone.evaluate("(paths) => paths.map(p => { const d = document.createElement('div');"
                            " window.CbsiteFormat.pathInto(d, p); return d.innerHTML; })", PATHS)
    assert script == [str(macro(p)) for p in PATHS]
    assert "embedding_<wbr>bag_<wbr>collection.<wbr>" in script[8]  # a long name may break after its `_`
    assert "over_<wbr>" not in script[3] and "_<wbr>mlp" not in script[3]  # a short one, or a leading `_`, never
