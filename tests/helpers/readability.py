"""Readability checks several browser files share: the icicle's labels and their contrast, the digits of table
numbers. JavaScript snippets for `page.evaluate` and the Python judgements of what they return."""

from __future__ import annotations

import re

# Every label the icicle draws: its text, the node's leaf name (what the table calls it), the text's drawn width,
# the width of its rectangle, its font size (px) and the names of its siblings (the node's too).
LABELS = """() => { const d = window.cbsiteRun.data, out = [];
  document.querySelectorAll('#cbsite-icicle g.cbsite-node').forEach(g => {
    const t = g.querySelector('text'); if (!t) return;
    const i = +g.dataset.index, name = i < 0 ? 'self' : (d.path[i] === '' ? d.model : d.name[i]);
    const siblings = i < 0 || d.parent[i] < 0 ? [] : d.name.filter((n, j) => d.parent[j] === d.parent[i]);
    out.push([t.textContent, name, t.getBBox().x + t.getBBox().width, +g.querySelector('rect').getAttribute('width'),
              parseFloat(getComputedStyle(t).fontSize), siblings]);
  });
  return out; }"""


def check_labels(labels) -> None:
    """A label is the node's name, its start (3+ characters) and an ellipsis, or, where its siblings' names share
    a start, the start of its name (never none of it), an ellipsis and the suffix that tells it apart ("t_c\u2026_7"
    of t_cat_0 ... t_cat_7); at 10 px or more, inside its rectangle."""
    assert labels
    for text, name, right, width, font, siblings in labels:
        label = re.sub("^[\u2715\u2248] ", "", text)  # a failed / estimated node's marker
        stem, cut, suffix = label.partition("\u2026")
        if cut and suffix and label != name:  # the stem kept, then a distinguishing suffix
            assert stem and name.startswith(stem), (text, name)  # never "\u2026_0": the stem stays
            assert name.endswith(suffix) and len(stem) + len(suffix) < len(name), (text, name)
            shared = name[: len(name) - len(suffix)]
            assert len(siblings) >= 2 and all(s.startswith(shared) for s in siblings), (text, name, siblings)
            assert len({s[len(shared):] for s in siblings}) == len(siblings), (text, siblings)  # tells them apart
        elif label != name:
            assert label.endswith("\u2026"), (text, name)
            assert name.startswith(label[:-1]) and len(label) - 1 >= 3, (text, name)  # its start, 3+ characters
        assert font >= 10, (text, font)
        assert right <= width, (text, right, width)  # drawn inside its rectangle


# The numbers of the visible number cells under `selector` (td.num), each with its cell's text.
NUMBERS = r"""(selector) => { const out = [];
  document.querySelectorAll(selector + ' td.num').forEach(td => {
    if (!td.getClientRects().length) return;
    for (const m of td.innerText.matchAll(/\d[\d,]*(?:\.\d+)?/g)) out.push([m[0], td.innerText]);
  });
  return out; }"""


def unreadable(found) -> list:
    bad = []
    for number, text in found:
        digits = number.replace(",", "").replace(".", "").lstrip("0")
        if number.startswith("0.000") or len(digits) > 4 and "." in number:
            bad.append(text)
    return bad


# Contrast of every icicle label against the fill drawn under it (WCAG relative luminance).
CONTRASTS = """() => {
  const lum = (c) => { const v = c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number).map(x => { x /= 255;
    return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const probe = document.createElement('span'); document.body.appendChild(probe);
  const css = (c) => { probe.style.color = c; return getComputedStyle(probe).color; };
  const out = [];
  document.querySelectorAll('#cbsite-icicle g.cbsite-node').forEach(g => {
    const t = g.querySelector('text'); if (!t) return;
    const fill = css(g.querySelector('rect').getAttribute('fill')), ink = getComputedStyle(t).fill;
    const a = lum(fill), b = lum(ink);
    out.push([t.textContent, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]);
  });
  probe.remove();
  return out; }"""
