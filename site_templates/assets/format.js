/* cbsite number formats, shared by the icicle, the tables and the details panel.
   They match the Python filters in cbsite/generator/pages.py: a missing value is an en dash. */
(function (global) {
  "use strict";
  var DASH = "\u2013";

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  function sig(v, digits) {
    var s = Number(v).toPrecision(digits);
    return String(Number(s));
  }

  function si(v, unit) {
    if (!isNum(v)) return DASH;
    var prefixes = ["", "k", "M", "G", "T", "P", "E"];
    var i = 0, x = v;
    while (Math.abs(x) >= 1000 && i < prefixes.length - 1) { x /= 1000; i++; }
    return sig(x, 3) + " " + prefixes[i] + unit;
  }

  var F = {
    DASH: DASH,
    isNum: isNum,
    ms: function (v) { return isNum(v) ? (Math.abs(v) < 1000 ? sig(v, 3) + " ms" : sig(v / 1000, 3) + " s") : DASH; },
    bytes: function (v) { return si(v, "B"); },
    mb: function (v) { return isNum(v) ? sig(v / 1e6, 3) : DASH; },
    flops: function (v) { return si(v, "FLOP"); },
    pct: function (v) { return isNum(v) ? sig(v * 100, 3) + "%" : DASH; },
    num: function (v) { return isNum(v) ? sig(v, 4) : (v === null || v === undefined ? DASH : String(v)); },
    NA: "n/a",
    /* MFU above 100 % is suspect (timing noise, or a peak the run could not confirm): shown with a marker. */
    suspect: function (v) { return isNum(v) && v > 1; },
    /* A utilisation (MFU, bandwidth): n/a where its numerator is zero by definition (a FLOP-free
       module has no MFU), a dash where it was not measured, a marker where MFU beats its peak. */
    util: function (v, numerator, mark) {
      if (numerator === 0) return "n/a";  // runs collected before this rule stored 0 here
      if (!isNum(v)) return DASH;
      return (mark && v > 1 ? "\u26a0 " : "") + sig(v * 100, 3) + "%";
    },
    /* A ratio head/base: 3 decimals below 10, 1 below 100, none above (pages.py fmt_ratio). */
    ratio: function (v, noUnit) {
      if (!isNum(v)) return DASH;
      var a = Math.abs(v);
      return v.toFixed(a < 10 ? 3 : a < 100 ? 1 : 0) + (noUnit ? "" : "\u00d7");
    },
    interval: function (lo, hi) {
      return isNum(lo) && isNum(hi) ? F.ratio(lo, true) + "\u2013" + F.ratio(hi) : DASH;
    },
    signed: function (v, fmt) {
      if (!isNum(v)) return DASH;
      return (v > 0 ? "+" : v < 0 ? "\u2212" : "\u00b1") + fmt(Math.abs(v));
    }
  };
  global.CbsiteFormat = F;
  if (typeof module !== "undefined" && module.exports) module.exports = F;
})(typeof window !== "undefined" ? window : globalThis);
