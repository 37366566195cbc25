"""The one number formatter's core (design.md: one definition of numbers and units, shared by Python and the
site's JavaScript): significant digits, decimal prefixes and rates. A core module: it imports nothing of cbsite,
so the core (`throughput`, `diff`) and the generator (`cbsite/generator/pages.py`, which builds every other
unit on it) use the same rules; `cbsite/generator/templates/assets/format.js` is the same in JavaScript and
tests tie the two (tests/test_site_readability.py, tests/test_diff_shares_cancelling_out.py)."""

from __future__ import annotations

import decimal
import math
from typing import Any

DASH = "\u2013"  # what an unknown number is shown as on the site
PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def finite(value: Any) -> bool:
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
    "1 kFLOP" (as cbsite.diff.format_amount writes it), never "1e+03 FLOP" or "1000 FLOP"."""
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


def counts(meta: dict[str, Any]) -> str:
    """A run's components by the status their rows carry, then its failed (component, phase) measurements, which
    the rows show as failed, or as estimated from the children with the error kept:
    "12 measured, 3 estimated, 0 failed, 0 skipped; 4 measurements failed"."""
    by_status = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
    text = ", ".join(f"{by_status.get(s, 0)} {s}" for s in ("measured", "estimated", "failed", "skipped"))
    failed = meta.get("failed_measurements")
    if isinstance(failed, int) and failed:
        text += f"; {failed} measurement{'s' if failed != 1 else ''} failed (see the rows' error)"
    return text
