"""The Jinja2 environment for the packaged templates (`cbsite/generator/templates/`): autoescaping, number formats, and where pages live.

Templates produce the HTML of every page; this module only provides values and plain-text formats.
Pages are `<folder>/index.md`, so a page's relative links are the same with or without directory URLs.
"""

from __future__ import annotations

import decimal
import functools
import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2

from cbsite import format as cfmt
from cbsite.archive import Run

# Shipped inside the package (package data), so an installed wheel builds sites with no source tree.
TEMPLATES = Path(__file__).resolve().parent / "templates"


def run_url(run: Run) -> str:
    return f"runs/{run.model}/{run.version}/{run.run_id}/"


def model_url(model: str) -> str:
    return f"models/{model}/"


def diff_url(base: Run, head: Run, consecutive: bool) -> str:
    """Consecutive versions get a readable address; any other pair is named by its two run ids."""
    if consecutive:
        return f"diffs/{head.model}/{base.version}/{head.version}/"
    return f"diffs/runs/{base.run_id}/{head.run_id}/"


def root_of(url: str) -> str:
    """The relative prefix from a page folder back to the site root ('' for the home page)."""
    depth = len(PurePosixPath(url).parts)
    return "../" * depth


# Plain-text number formats for templates; None (not measured) is an en dash everywhere.
DASH = cfmt.DASH


# The core of the one formatter lives in cbsite.format (core modules such as cbsite.throughput use it too).
_sig = cfmt.sig
_finite = cfmt.finite
_si = cfmt.si


def fmt_ms(value: float | None) -> str:
    if not _finite(value):
        return DASH
    text = _sig(value)
    return f"{text} ms" if abs(float(text)) < 1000 else f"{_sig(value / 1000)} s"


def fmt_time(value: float | None) -> str:
    """A duration given in ms, in the unit that keeps 3 significant digits readable: s, ms, µs or ns ("81.4 ns",
    never "0.0000814 ms"); the unit is chosen after rounding. format.js `time` is the same rule."""
    if not _finite(value):
        return DASH
    if value == 0 or abs(float(_sig(value))) >= 1:
        return fmt_ms(value)
    if abs(float(_sig(value * 1000))) >= 1:
        return f"{_sig(value * 1000)} \u00b5s"
    return f"{_sig(value * 1e6)} ns"


def fmt_bytes(value: float | None) -> str:
    return _si(value, "B")


def fmt_flops(value: float | None) -> str:
    return _si(value, "FLOP")


def fmt_rate(value: float | None) -> str:
    """A rate such as examples per second: "49.1k", "442k", "1M" (cbsite.format.rate; format.js `rate` is the
    same rule), for "{{ v|rate }} examples/s"."""
    return cfmt.rate(value)


def fmt_ms_range(lo: float | None, hi: float | None) -> str:
    """A range of durations in ms written once with its unit where both ends share it ("4.24–6.06 ms", as `ms`
    writes each end; "950 ms–1.2 s" across units; DASH when an end is unknown)."""
    if not _finite(lo) or not _finite(hi):
        return DASH
    a, b = fmt_ms(lo), fmt_ms(hi)
    if a.rsplit(" ", 1)[-1] == b.rsplit(" ", 1)[-1]:
        a = a.rsplit(" ", 1)[0]
    return f"{a}\u2013{b}"


def fmt_speedup(value: float | None) -> str:
    """A torch.compile speed-up (eager ms / compiled ms), 3 significant digits with its direction stated:
    "1.29× (faster)", "0.773× (slower)", "1× (no change)" where it rounds to 1; DASH when unknown or not > 0."""
    if not _finite(value) or value <= 0:
        return DASH
    text = _sig(value)
    word = "no change" if float(text) == 1 else ("faster" if value > 1 else "slower")
    return f"{text}\u00d7 ({word})"


def fmt_pct(value: float | None) -> str:
    return f"{_sig(value * 100)}%" if _finite(value) else DASH


def fmt_num(value: Any) -> str:
    """A plain number (format.js `num`): a whole number below a million as it is, anything from a million
    up with 4 significant digits and a decimal prefix ("1.235 M", "1 T"), the rest with 4 significant digits."""
    if value is None:
        return DASH
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return DASH
    if abs(value) >= 1e6:
        prefixes = ["", "k", "M", "G", "T", "P", "E"]
        v, i = float(value), 0
        while abs(float(_sig(v, 4))) >= 1000 and i < len(prefixes) - 1:
            v /= 1000
            i += 1
        return f"{_sig(v, 4)} {prefixes[i]}"
    if float(value).is_integer():
        return str(int(value))
    return _sig(value, 4)


def fmt_ratio(value: float | None, unit: bool = True) -> str:
    """A ratio head/base: "1.052×" (3 decimals below 10, as the PR comment writes it), "12.4×", "153×".
    format.js `ratio` is the same rule (tests/test_generator_latency.py ties them)."""
    if value is None or not math.isfinite(value):
        return DASH
    places = 3 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    # Exact halves round away from zero, as JavaScript's toFixed does (Python's format rounds them to even).
    text = str(decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-places), rounding=decimal.ROUND_HALF_UP))
    return text + ("\u00d7" if unit else "")


def fmt_signed(value: float | None, kind: str) -> str:
    """A delta with its sign, in the metric's unit."""
    if value is None:
        return DASH
    body = {"ms": fmt_ms, "time": fmt_time, "bytes": fmt_bytes, "flops": fmt_flops}[kind](abs(value))
    return ("+" if value > 0 else "\u2212" if value < 0 else "\u00b1") + body


def path_tails(paths: list[str]) -> list[str]:
    """Every distinct tail of the component paths that starts after a dot, in tree order: "model.0._mlp.1._linear",
    "0._mlp.1._linear", ..., "_linear" of "over_arch.model.0._mlp.1._linear". Search matches the start of a word
    (MkDocs Material's lunr adds a trailing wildcard) and the separator keeps a path one word, so the whole paths
    alone find only their starts; with these tails on the page a query for any middle part that begins at a dot
    ("model.0._mlp", "_mlp.1") matches the start of a tail. Each tail is given once however many paths end with it."""
    seen: dict[str, None] = {}
    for path in paths:
        at = path.find(".")
        while at >= 0:
            seen.setdefault(path[at + 1:], None)
            at = path.find(".", at + 1)
    return list(seen)


_RATIO = re.compile(r"^(?P<ratio>new|\d+(?:\.\d+)?\u00d7|[+\u2212\u00b1-]<?\d+(?:\.\d+)?%) ")
_SENTENCE = re.compile(r"(?<=\.) (?=[A-Z0-9])")


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` where it stands outside parentheses."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += ch == "("
        depth -= ch == ")" and depth > 0
        if depth == 0 and text.startswith(sep, i):
            out.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    out.append(text[start:])
    return [t for t in out if t]


def _magnitude(ratio: str) -> float:
    """How far a total moved, from its ratio in words ("2.9×", "+81%", "−34%", "new"): |ln(head / base)|."""
    if ratio == "new":
        return math.inf
    number = float(re.sub(r"[^\d.]", "", ratio) or 0)
    factor = number if ratio.endswith("\u00d7") else 1 + (-1 if ratio[0] in "\u2212-" else 1) * number / 100
    return abs(math.log(factor)) if factor > 0 else math.inf


def change_digest(summary: str, largest: int = 3) -> dict[str, Any]:
    """A diff's summary (cbsite.diff.RunDiff.summary: one paragraph) cut up for the home page's table, every word
    of it kept: `largest`, the latency changes, then the `largest` other totals that moved most ("2.9× forward
    FLOPs (+12.6 MFLOP)"), each group by |ln ratio|;
    `totals`, the first sentence's other clauses in their order (smaller changes, "within noise", "unchanged ...");
    `notes`, the other sentences, each "; "-joined clause on its own ("The largest part of the FLOP growth ...").
    A summary of another shape (no "title: " first sentence) comes back whole in `notes`."""
    sentences = _SENTENCE.split(summary.strip())
    head, _, body = sentences[0].partition(": ")
    if not body or not body.endswith("."):
        return {"largest": [], "totals": "", "notes": [summary]}
    clauses = _split_top(body[:-1], ", ")
    ranked = sorted((c for c in clauses if _RATIO.match(c)), key=lambda c: -_magnitude(_RATIO.match(c).group("ratio")))
    moved = [c for c in ranked if " latency (" in c] + [c for c in ranked if " latency (" not in c][:largest]
    rest = [c for c in clauses if c not in moved]
    notes = []
    for sentence in sentences[1:]:
        parts = _split_top(sentence[:-1] if sentence.endswith(".") else sentence, "; ")
        notes.extend(p[:1].upper() + p[1:] for p in parts)
    return {"largest": moved, "totals": ", ".join(rest), "notes": notes}


@functools.lru_cache(maxsize=4)
def environment(bytecode_dir: str | None = None) -> jinja2.Environment:
    """One environment per process: templates are compiled once, not once per build. With `bytecode_dir` (a
    build cache's folder) the compiled templates are also kept between processes (a second or so each)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        bytecode_cache=jinja2.FileSystemBytecodeCache(bytecode_dir) if bytecode_dir else None,
        autoescape=True,  # every page is HTML inside Markdown: escape every value, whatever the file suffix
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        ms=fmt_ms, time=fmt_time, bytes=fmt_bytes, flops=fmt_flops, pct=fmt_pct, num=fmt_num, signed=fmt_signed,
        ratio=fmt_ratio, rate=fmt_rate, ms_range=fmt_ms_range, speedup=fmt_speedup,
        # YAML front matter: a JSON string is a valid YAML scalar, and tojson escapes <, >, & and '.
        yaml_str=lambda s: jinja2.utils.htmlsafe_json_dumps(str(s)),
    )
    env.globals.update(run_url=run_url, model_url=model_url, DASH=DASH, path_tails=path_tails,
                       change_digest=change_digest)
    return env


def dump_json(data: Any, path: Path) -> None:
    """Data files for the browser: sorted keys and no whitespace, so the same archive gives the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
