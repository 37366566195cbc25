"""The one number formatter (design.md: one definition of numbers and units, shared by Python and the site's
JavaScript): significant digits, decimal prefixes, rates, the site's units and the reports' changes and shares.
A core module: it imports nothing of cbsite, so the core (`diff`, `gate`, `throughput`), the reports and the
generator's templates use the same rules; `cbsite/generator/templates/assets/format.js` is the site's half in
JavaScript, and tests run both on the same values (grep format.js in tests/)."""

from __future__ import annotations

import decimal
import math
from typing import Any, TypeGuard

DASH = "\u2013"  # what an unknown number is shown as on the site
MINUS = "\u2212"  # typographic minus, as in "−12%"
PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def finite(value: Any) -> TypeGuard[float]:
    """A real number that can be written (not None, not a bool, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sig(value: float, digits: int = 3) -> str:
    """`digits` significant digits written as JavaScript writes `Number(v.toPrecision(digits))`: halves
    rounded away from zero, no trailing zeros, no exponent between 1e-7 and 1e21. format.js `sig` is the
    same rule; tests/test_site_readability.py ties the two on many values."""
    d = decimal.Decimal(value)  # the float's exact value
    if d == 0:
        return "0"
    q = d.quantize(decimal.Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=decimal.ROUND_HALF_UP)
    x = float(q)
    if 1e-7 <= abs(x) < 1e21:
        return format(decimal.Decimal(repr(x)).normalize(), "f")
    return repr(x).replace("e-0", "e-").replace("e+0", "e+")


def si(value: float | None, unit: str, base: float = 1000.0) -> str:
    """3 significant digits and a decimal prefix; the prefix is chosen after rounding, so 999.6 FLOP is
    "1 kFLOP" (as `amount` writes it), never "1e+03 FLOP" or "1000 FLOP"."""
    if not finite(value):
        return DASH
    v, i = float(value), 0
    while abs(float(sig(v))) >= base and i < len(PREFIXES) - 1:
        v /= base
        i += 1
    return f"{sig(v)} {PREFIXES[i]}{unit}"


def rate(value: float | None) -> str:
    """A rate such as examples per second, 3 significant digits and a decimal prefix written onto the number
    ("49.1k", "442k", "1.2M", "168"; the prefix chosen after rounding: 999.6 is "1k", never "1e+03k");
    DASH when unknown. format.js `rate` is the same rule."""
    if not finite(value):
        return DASH
    return si(value, "").replace(" ", "")


def examples_rate(value: float | None) -> str:
    """Examples per second as the reports write them: "49.1k examples/s", "1M examples/s" at 999,600 (never
    "1e+03k"); "n/a" when unknown."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{rate(value)} examples/s"


def counts(meta: dict[str, Any]) -> str:
    """A run's components by the status their rows carry, then its failed (component, phase) measurements, which
    the rows show as failed, or as estimated from the children with the error kept:
    "12 measured, 3 estimated, 0 failed, 0 skipped; 4 measurements failed"."""
    by_status = c if isinstance(c := meta.get("counts"), dict) else {}
    text = ", ".join(f"{by_status.get(s, 0)} {s}" for s in ("measured", "estimated", "failed", "skipped"))
    failed = meta.get("failed_measurements")
    if isinstance(failed, int) and failed:
        text += f"; {failed} measurement{'s' if failed != 1 else ''} failed (see the rows' error)"
    return text


# --- the site's formats (Jinja2 filters in cbsite/generator/templating.py; format.js writes the same) ---------


def fmt_ms(value: float | None) -> str:
    if not finite(value):
        return DASH
    text = sig(value)
    return f"{text} ms" if abs(float(text)) < 1000 else f"{sig(value / 1000)} s"


def fmt_time(value: float | None) -> str:
    """A duration given in ms, in the unit that keeps 3 significant digits readable: s, ms, µs or ns ("81.4 ns",
    never "0.0000814 ms"); the unit is chosen after rounding. format.js `time` is the same rule."""
    if not finite(value):
        return DASH
    if value == 0 or abs(float(sig(value))) >= 1:
        return fmt_ms(value)
    if abs(float(sig(value * 1000))) >= 1:
        return f"{sig(value * 1000)} \u00b5s"
    return f"{sig(value * 1e6)} ns"


def fmt_bytes(value: float | None) -> str:
    return si(value, "B")


def fmt_flops(value: float | None) -> str:
    return si(value, "FLOP")


def fmt_rate(value: float | None) -> str:
    """A rate such as examples per second: "49.1k", "442k", "1M" (format.js `rate` is the same rule), for
    "{{ v|rate }} examples/s"."""
    return rate(value)


def fmt_ms_range(lo: float | None, hi: float | None) -> str:
    """A range of durations in ms written once with its unit where both ends share it ("4.24–6.06 ms", as `ms`
    writes each end; "950 ms–1.2 s" across units; DASH when an end is unknown)."""
    if not finite(lo) or not finite(hi):
        return DASH
    a, b = fmt_ms(lo), fmt_ms(hi)
    if a.rsplit(" ", 1)[-1] == b.rsplit(" ", 1)[-1]:
        a = a.rsplit(" ", 1)[0]
    return f"{a}\u2013{b}"


def fmt_speedup(value: float | None) -> str:
    """A torch.compile speed-up (eager ms / compiled ms), 3 significant digits with its direction stated:
    "1.29× (faster)", "0.773× (slower)", "1× (no change)" where it rounds to 1; DASH when unknown or not > 0."""
    if not finite(value) or value <= 0:
        return DASH
    text = sig(value)
    word = "no change" if float(text) == 1 else ("faster" if value > 1 else "slower")
    return f"{text}\u00d7 ({word})"


def fmt_pct(value: float | None) -> str:
    return f"{sig(value * 100)}%" if finite(value) else DASH


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
        v, i = float(value), 0
        while abs(float(sig(v, 4))) >= 1000 and i < len(PREFIXES) - 1:
            v /= 1000
            i += 1
        return f"{sig(v, 4)} {PREFIXES[i]}"
    if float(value).is_integer():
        return str(int(value))
    return sig(value, 4)


def fmt_ratio(value: float | None, unit: bool = True) -> str:
    """A ratio head/base: "1.052×" (3 decimals below 10, as the PR comment writes it), "12.4×", "153×".
    format.js `ratio` is the same rule."""
    if value is None or not math.isfinite(value):
        return DASH
    places = 3 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    # Exact halves round away from zero, as JavaScript's toFixed does (Python's format rounds them to even).
    text = str(decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-places), rounding=decimal.ROUND_HALF_UP))
    return text + ("\u00d7" if unit else "")


def fmt_signed(value: float | None, kind: str) -> str:
    """A delta with its sign, in the metric's unit (`kind`: ms, time, bytes or flops)."""
    if value is None:
        return DASH
    body = {"ms": fmt_ms, "time": fmt_time, "bytes": fmt_bytes, "flops": fmt_flops}[kind](abs(value))
    return ("+" if value > 0 else MINUS if value < 0 else "\u00b1") + body


# --- the reports' formats: the diff summary, the PR comment, the terminal and the gate ------------------------
# They predate the site's rules and differ from them in places (3 significant digits by Python's `g`, whole
# numbers from 1,000 ms up); kept as they are so summaries and comments stay the same text.


def amount(metric: str, value: float) -> str:
    """A diff metric's value with its unit: FLOPs and bytes with decimal SI prefixes, latency in ms."""
    if metric in ("latency_ms",):
        return f"{_sig3(value)} ms"
    unit = "FLOP" if metric == "flops" else "B"
    i = 0
    while i < len(PREFIXES) - 1 and abs(float(_sig3(value))) >= 1000:
        value /= 1000
        i += 1
    return f"{_sig3(value)} {PREFIXES[i]}{unit}"


def delta(metric: str, value: float | None) -> str:
    """A signed change with its unit: "+12.3 MB", "−1.2 GFLOP", "+0.0123 ms"; "n/a" when unknown."""
    if value is None:
        return "n/a"
    sign = "+" if value > 0 else (MINUS if value < 0 else "±")
    return sign + amount(metric, abs(value))


def change(base: float | None, head: float | None) -> str:
    """A change from `base` to `head` in words: "2.8×" from double up, "+39%", "−12%", "±0%", "new", or "n/a"."""
    if base is None or head is None:
        return "n/a"
    if base == 0:
        return "±0%" if head == 0 else "new"
    ratio = head / base
    if ratio >= 2:
        return times(ratio)
    return signed_pct(ratio - 1)


def change_as_written(base: float | None, head: float | None) -> float | None:
    """head / base rounded as `change` writes it ("2.0×" is 2.0, "+81%" is 1.81, "+<0.001%" is 1.00001), so
    totals that read the same rank the same; None where `change` says "n/a", infinity for "new"."""
    if base is None or head is None:
        return None
    if base == 0:
        return 1.0 if head == 0 else math.inf
    ratio = head / base
    if ratio >= 2:
        return float(f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}")
    pct = (ratio - 1) * 100
    if pct == 0:
        return 1.0
    if abs(pct) >= 1:
        shown = float(f"{abs(pct):.0f}")
    elif abs(pct) >= 0.001:
        shown = float(f"{abs(pct):.2g}")
    else:
        shown = 0.001
    return 1 + (shown if pct > 0 else -shown) / 100


def times(ratio: float) -> str:
    """A ratio of 2 or more: "2.8×", "15×"."""
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"


def ratio3(ratio: float, unit: str = "×") -> str:
    """A verdict's ratio with 3 decimals, as the reports list them: "1.052×" (Python's rounding)."""
    return f"{ratio:.3f}{unit}"


def signed_pct(rel: float) -> str:
    """A relative change: "+39%", "−0.52%", "±0%"; a real but tiny one is "+<0.001%", never "±0%"."""
    pct = rel * 100
    if pct == 0:
        return "±0%"
    if abs(pct) >= 1:
        text = f"{abs(pct):.0f}%"
    elif abs(pct) >= 0.001:
        text = f"{abs(pct):.2g}%"
    else:
        text = "<0.001%"
    return ("+" if pct > 0 else MINUS) + text


def share(fraction: float) -> str:
    """A share of a change in whole percent: "43%"."""
    return f"{fraction * 100:.0f}%"


def share_fits(fraction: float) -> bool:
    """True when `share` writes the fraction as a share a person can read: 0 % to 100 % once rounded."""
    return 0 <= round(fraction * 100) <= 100


def pct2(fraction: float) -> str:
    """A percentage with 2 significant digits below 10 %, whole above: "4.2%", "37%" (sign only when negative)."""
    pct = fraction * 100
    return f"{pct:.0f}%" if abs(pct) >= 10 else f"{pct:.2g}%"


def signed_pct2(rel: float) -> str:
    """`pct2` with its sign always written: "+4.2%", "−37%", "±0%"."""
    sign = "+" if rel > 0 else (MINUS if rel < 0 else "±")
    return sign + pct2(abs(rel))


def pct_spaced(x: float, signed: bool = True) -> str:
    """A relative change as statistics write it: "+4.2 %" (1 decimal below 10 %, none above), "0 %"."""
    v = 100.0 * x
    text = f"{abs(v):.1f}".rstrip("0").rstrip(".") if abs(v) < 9.95 else f"{abs(v):.0f}"
    if text == "0":
        return "0 %"
    sign = ("+" if v > 0 else "-") if signed else ""
    return f"{sign}{text} %"


def ms_g3(value: float | None) -> str:
    """A duration in ms with 3 significant digits by Python's `g` ("12.3 ms"); "n/a" when unknown."""
    return "n/a" if value is None else f"{value:.3g} ms"


def json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: such a float becomes None, inside dicts and lists too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _sig3(value: float) -> str:
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text
