/* cbsite number formats, shared by the icicle, the tables and the details panel.
   They match the Python formatter, cbsite/format.py (the templates' filters): a missing value is an en dash. */
(function (global) {
  "use strict";
  var DASH = "\u2013";

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  /* `digits` significant digits, no trailing zeros (format.py sig is the same rule). */
  function sig(v, digits) {
    var s = Number(v).toPrecision(digits);
    return String(Number(s));
  }

  /* The prefix is chosen after rounding: 999.6 FLOP is "1 kFLOP", as in Python (format.py si). */
  function si(v, unit) {
    if (!isNum(v)) return DASH;
    var prefixes = ["", "k", "M", "G", "T", "P", "E"];
    var i = 0, x = v;
    while (Math.abs(Number(sig(x, 3))) >= 1000 && i < prefixes.length - 1) { x /= 1000; i++; }
    return sig(x, 3) + " " + prefixes[i] + unit;
  }

  var F = {
    DASH: DASH,
    sig: sig,
    isNum: isNum,
    ms: function (v) { return isNum(v) ? (Math.abs(Number(sig(v, 3))) < 1000 ? sig(v, 3) + " ms" : sig(v / 1000, 3) + " s") : DASH; },
    /* A duration given in ms, in the unit that keeps 3 significant digits readable: s, ms, \u00b5s or ns
       ("81.4 ns", never "0.0000814 ms"); the unit is chosen after rounding (format.py fmt_time). */
    time: function (v) {
      if (!isNum(v)) return DASH;
      if (v === 0 || Math.abs(Number(sig(v, 3))) >= 1) return F.ms(v);
      if (Math.abs(Number(sig(v * 1000, 3))) >= 1) return sig(v * 1000, 3) + " \u00b5s";
      return sig(v * 1e6, 3) + " ns";
    },
    bytes: function (v) { return si(v, "B"); },
    flops: function (v) { return si(v, "FLOP"); },
    /* A rate (examples per second): 3 significant digits and a prefix on the number, "49.1k" (format.py fmt_rate). */
    rate: function (v) { return isNum(v) ? si(v, "").replace(" ", "") : DASH; },
    pct: function (v) { return isNum(v) ? sig(v * 100, 3) + "%" : DASH; },
    /* A plain number: whole below a million as it is, from a million up 4 digits and a prefix (format.py fmt_num). */
    num: function (v) {
      if (v === null || v === undefined) return DASH;
      if (!isNum(v)) return typeof v === "number" ? DASH : String(v);
      if (Math.abs(v) >= 1e6) {
        var prefixes = ["", "k", "M", "G", "T", "P", "E"], i = 0, x = v;
        while (Math.abs(Number(sig(x, 4))) >= 1000 && i < prefixes.length - 1) { x /= 1000; i++; }
        return sig(x, 4) + " " + prefixes[i];
      }
      return Number.isInteger(v) ? String(v) : sig(v, 4);
    },
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
    /* A ratio head/base: 3 decimals below 10, 1 below 100, none above (format.py fmt_ratio). */
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
    },
    /* A component path appended to `el` with a <wbr> after each `.`, and after each `_` inside a name longer than
       16 characters (not after a leading `_`): the only places a line may break (cbsite.css .cbsite-path), as the
       templates' `path` macro (_macros.j2) writes it; a name with neither is a bare text node. */
    pathInto: function (el, path) {
      path = String(path);
      if (!/[._]/.test(path)) return el.appendChild(document.createTextNode(path));  // nothing to break
      var span = el.appendChild(document.createElement("span")), parts = path.split(".");
      span.className = "cbsite-path";
      var put = function (text) {
        span.appendChild(document.createTextNode(text));
        span.appendChild(document.createElement("wbr"));
      };
      parts.forEach(function (seg, j) {
        var pieces = seg.split("_"), text = "";
        pieces.forEach(function (piece, k) {
          text += piece;
          if (k === pieces.length - 1) return;
          text += "_";
          if (seg.length > 16 && piece) { put(text); text = ""; }
        });
        if (j < parts.length - 1) put(text + ".");
        else if (text) span.appendChild(document.createTextNode(text));
      });
      return span;
    }
  };
  global.CbsiteFormat = F;
  if (typeof module !== "undefined" && module.exports) module.exports = F;
})(typeof window !== "undefined" ? window : globalThis);
