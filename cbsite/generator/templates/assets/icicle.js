/* cbsite icicle.
   `layout` is pure (no DOM): the hypothesis tests run this very file with node.
   `Icicle` draws a layout as SVG, with a tooltip, click-to-zoom and ancestors to back out. */
(function (global) {
  "use strict";

  var EPS = 1e-9;

  /* Lay out the subtree of `root` in [0, 1].
     parent: parent index per node (-1 for the root), in pre-order (parent[i] < i).
     value:  the width metric per node; null/undefined/negative/NaN means "not known".
     A node's size is its value, or the sum of its children's sizes when its value is not known.
     Children sit left to right inside their parent, each as wide as its share of the parent's size, so a
     parent larger than its children keeps a self share at its right end. Children that sum to more than
     a known parent (replay noise; peaks that do not add up) are scaled down together to fit, and the
     parent's `overflow` records by how much. */
  function layout(parent, value, root) {
    var n = parent.length;
    var size = new Float64Array(n), childSum = new Float64Array(n);
    var first = new Int32Array(n).fill(-1), next = new Int32Array(n).fill(-1), last = new Int32Array(n).fill(-1);
    for (var i = 0; i < n; i++) {
      var p = parent[i];
      if (p >= i) throw new Error("layout: parents must precede children (node " + i + ")");
      if (p >= 0) {
        if (first[p] < 0) first[p] = i; else next[last[p]] = i;
        last[p] = i;
      }
    }
    for (i = n - 1; i >= 0; i--) {  // children before parents
      var v = value[i];
      var known = typeof v === "number" && isFinite(v) && v >= 0;
      size[i] = known ? v : childSum[i];
      if (parent[i] >= 0) childSum[parent[i]] += size[i];
    }
    var x0 = new Float64Array(n).fill(NaN), x1 = new Float64Array(n).fill(NaN);
    var depth = new Int32Array(n).fill(-1), selfStart = new Float64Array(n).fill(NaN);
    var overflow = new Float64Array(n).fill(0);
    var nodes = [];
    var maxDepth = 0;
    x0[root] = 0; x1[root] = 1; depth[root] = 0;
    var stack = [root];
    while (stack.length) {
      var a = stack.pop();
      nodes.push(a);
      if (depth[a] > maxDepth) maxDepth = depth[a];
      if (first[a] < 0) continue;
      var width = x1[a] - x0[a];
      var total = Math.max(size[a], childSum[a]);
      if (childSum[a] > size[a] * (1 + EPS)) overflow[a] = size[a] > 0 ? childSum[a] / size[a] : Infinity;
      var k = total > 0 ? width / total : 0;
      var cursor = x0[a];
      var kids = [];
      for (var c = first[a]; c >= 0; c = next[c]) {
        x0[c] = cursor;
        x1[c] = Math.min(cursor + size[c] * k, x1[a]);
        cursor = x1[c];
        depth[c] = depth[a] + 1;
        kids.push(c);
      }
      selfStart[a] = cursor;
      for (var j = kids.length - 1; j >= 0; j--) stack.push(kids[j]);
    }
    return { x0: x0, x1: x1, depth: depth, size: size, childSum: childSum, overflow: overflow,
             selfStart: selfStart, nodes: nodes, maxDepth: maxDepth };
  }

  /* The chain root -> ... -> parent of `node`, for the breadcrumb rows above a zoomed subtree. */
  function ancestors(parent, node) {
    var out = [];
    for (var p = parent[node]; p >= 0; p = parent[p]) out.unshift(p);
    return out;
  }

  /* ----- colour ----- */
  var SEQ = ["#f7fcf5", "#d9f0d3", "#a6dba0", "#5aae61", "#1b7837", "#00441b"];
  var DIV = ["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b"];
  /* Named ramps, so that two metrics never share one (MFU green, bandwidth purple). */
  var RAMPS = { green: SEQ, purple: ["#fcfbfd", "#dadaeb", "#bcbddc", "#9e9ac8", "#6a51a3", "#3f007d"], diverging: DIV };
  var NONE = "#cccccc";
  /* In Material's dark scheme ("slate") the diverging scale's centre (no change) is a neutral grey, not the
     near-white #f7f7f7 that drew unchanged leaves as white boxes on the dark page. */
  var DIV_DARK = ["#2166ac", "#67a9cf", "#9fb4c0", "#6e6e6e", "#c4a497", "#ef8a62", "#b2182b"];
  /* The dark scheme's sequential ramps run the other way: from a dim shade near the page's own colour (little)
     to a bright one (much), as light on a dark page reads as "more". The light ramps drawn there made a node
     at 0 % MFU the brightest box of the page. Each label is black or white, whichever contrasts more (textOn). */
  var RAMPS_DARK = { green: ["#1d3b27", "#1f5631", "#2a7a3f", "#3f9a4e", "#6cc06c", "#a3e29c"],
                     purple: ["#2b2344", "#3e2f6e", "#5a429a", "#7a62bd", "#9d86d8", "#c0aff0"], diverging: DIV_DARK };
  /* The fills that are not values: no value, ancestors above a zoomed node, self shares, skipped nodes; and
     the hatching drawn over estimated, failed and self boxes. Light on the light page, dim on the dark one. */
  var FILLS = { none: NONE, ancestor: "#e8e8e8", self: "#f3f3f3", skipped: "#dddddd", hatch: "#555555" };
  var FILLS_DARK = { none: "#62656f", ancestor: "#3a3e4a", self: "#2a2d37", skipped: "#4a4d57", hatch: "#c8c8c8" };
  function dark() {
    return typeof document !== "undefined" && !!document.body && document.body.getAttribute("data-md-color-scheme") === "slate";
  }
  function fills() { return dark() ? FILLS_DARK : FILLS; }

  function rgb(colour) {
    if (colour.charAt(0) === "#") {
      var v = parseInt(colour.slice(1), 16);
      return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
    }
    return colour.replace(/[^0-9,]/g, "").split(",").map(Number);
  }
  /* WCAG relative luminance and contrast ratio. */
  function luminance(colour) {
    var c = rgb(colour).map(function (x) { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  }
  function contrast(a, b) {
    var x = luminance(a), y = luminance(b);
    return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
  }
  var DARK_TEXT = "#000000", LIGHT_TEXT = "#ffffff";  // black, not near-black: every fill then reaches 4.58:1
  /* The label colour with the better contrast on a fill (near-black on light fills, white on dark ones). */
  function textOn(fill) { return contrast(fill, DARK_TEXT) >= contrast(fill, LIGHT_TEXT) ? DARK_TEXT : LIGHT_TEXT; }

  /* The label that fits `max` characters, every cut one keeping the start of the name: the whole name; else, where its
     siblings share the start of their names (`suffix`, siblingSuffixes: "_0" of t_cat_0), as much of its start as
     fits, an ellipsis and that suffix ("t_c…_0"): the stem and the index both stay; else its start and an ellipsis
     ("embedding_bags…"); else nothing (""): fewer than MIN_CHARS characters of a name tell nothing ("t…0" read as
     noise). A status marker ("\u2715 ", "\u2248 ") goes first when there is room for it; the hatching says the same. */
  var MIN_CHARS = 3;
  function shorten(text, max, marker, suffix) {
    marker = marker || "";
    if (marker.length + text.length <= max) return marker + text;
    var stem = suffix ? max - marker.length - 1 - suffix.length : 0;
    if (stem >= 1 && stem < text.length - suffix.length) return marker + text.slice(0, stem) + "\u2026" + suffix;
    if (max - marker.length - 1 >= MIN_CHARS) return marker + text.slice(0, max - marker.length - 1) + "\u2026";
    if (text.length <= max) return text;
    if (max - 1 >= MIN_CHARS) return text.slice(0, max - 1) + "\u2026";
    return "";
  }

  /* What siblings' names share, cut after its last separator ("t_cat_" of t_cat_0 ... t_cat_7): the suffixes
     after it tell the siblings apart ("_0", "_7"). name -> suffix (separator included), for siblings whose names
     are distinct and share a start; {} where they share none. */
  function siblingSuffixes(names) {
    var out = {};
    if (names.length < 2) return out;
    var seen = {};
    for (var i = 0; i < names.length; i++) { if (seen[names[i]]) return out; seen[names[i]] = true; }
    var prefix = names[0];
    names.forEach(function (n) { var k = 0; while (k < prefix.length && k < n.length && prefix[k] === n[k]) k++; prefix = prefix.slice(0, k); });
    var cut = Math.max(prefix.lastIndexOf("_"), prefix.lastIndexOf("."), prefix.lastIndexOf("-"));
    if (cut < 1) return out;  // no shared word: nothing to drop
    names.forEach(function (n) { if (n.length > cut) out[n] = n.slice(cut); });
    return out;
  }

  var FONTS = [12, 11, 10];  // px: a smaller font before a shorter label, never below 10 px
  /* The labels a node may get whole, best first, each [text, font size in px]: its whole name at 12, 11 or 10 px;
     a name that fits none of them is cut (shorten) at the font that keeps the most of it. */
  function labelChoices(name, marker) {
    return FONTS.map(function (f) { return [(marker || "") + name, f]; });
  }

  function mix(stops, t) {
    t = Math.max(0, Math.min(1, t));
    var pos = t * (stops.length - 1), i = Math.min(Math.floor(pos), stops.length - 2), f = pos - i;
    var a = parseInt(stops[i].slice(1), 16), b = parseInt(stops[i + 1].slice(1), 16);
    var r = Math.round(((a >> 16) & 255) * (1 - f) + ((b >> 16) & 255) * f);
    var g = Math.round(((a >> 8) & 255) * (1 - f) + ((b >> 8) & 255) * f);
    var bl = Math.round((a & 255) * (1 - f) + (b & 255) * f);
    return "rgb(" + r + "," + g + "," + bl + ")";
  }

  /* A colour scale over the values shown: linear from 0 for ratios, log for magnitudes,
     symmetric around 0 for deltas; "unit" is absolute, 0 to 100 % whatever is shown (utilisations: a node
     at 21 % is never drawn as dark as one at 90 %); "category" maps names to fixed colours.
     `ramp` names the sequential ramp (RAMPS), `categories` the colours of a categorical scale. */
  function scale(values, kind, ramp, categories) {
    var isDark = dark(), NONE = fills().none;
    var stops = (isDark ? RAMPS_DARK[ramp] || RAMPS_DARK.green : RAMPS[ramp] || SEQ);
    if (kind === "category") {
      var cats = categories || {};
      return { lo: null, hi: null, kind: kind, categories: cats, none: NONE, colour: function (v) {
        return Object.prototype.hasOwnProperty.call(cats, v) ? cats[v] : NONE; } };
    }
    if (kind === "unit") {
      return { lo: 0, hi: 1, kind: kind, stops: stops, none: NONE, colour: function (v) {
        return typeof v === "number" && isFinite(v) ? mix(stops, v) : NONE; } };
    }
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (typeof v !== "number" || !isFinite(v)) continue;
      if (kind === "log" && v <= 0) continue;
      if (kind === "diverging") v = Math.abs(v);
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!(hi > -Infinity)) return { colour: function () { return NONE; }, lo: null, hi: null, kind: kind, stops: stops, none: NONE };
    if (kind === "diverging") {
      var m = hi || 1, div = isDark ? DIV_DARK : DIV;
      return { lo: -m, hi: m, kind: kind, stops: div, none: NONE, colour: function (v) {
        return typeof v === "number" && isFinite(v) ? mix(div, 0.5 + v / (2 * m)) : NONE; } };
    }
    if (kind === "log") {
      var l0 = Math.log(lo), l1 = Math.log(hi);
      return { lo: lo, hi: hi, kind: kind, stops: stops, none: NONE, colour: function (v) {
        if (typeof v !== "number" || !(v > 0)) return NONE;
        return mix(stops, l1 > l0 ? (Math.log(v) - l0) / (l1 - l0) : 1); } };
    }
    var top = hi > 0 ? hi : 1;
    return { lo: 0, hi: top, kind: kind, stops: stops, none: NONE, colour: function (v) {
      return typeof v === "number" && isFinite(v) ? mix(stops, v / top) : NONE; } };
  }

  /* ----- renderer ----- */
  var SVGNS = "http://www.w3.org/2000/svg";
  var ROW = 24;
  var CHAR = 7.3;  // width of a label character at the icicle's 12 px monospace

  function el(name, attrs, parentNode) {
    var e = document.createElementNS(SVGNS, name);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]);
    if (parentNode) parentNode.appendChild(e);
    return e;
  }

  /* Labels measured as drawn (the font the browser picked, not CHAR's guess): one that overflows its
     rectangle loses characters until it fits, or goes when fewer than MIN_CHARS would show. Every drawn width is
     read first (one layout); an overflowing label's candidates are then measured on a canvas in the label's font,
     scaled by its own drawn/canvas ratio, so no label is written and read back in turn (a layout each). */
  var measurer = null;
  function fitLabels(svg) {
    var texts = svg.querySelectorAll("text[data-room]"), over = [];
    for (var i = 0; i < texts.length; i++) {
      var room = +texts[i].getAttribute("data-room"), len = texts[i].getComputedTextLength();
      if (len > room) over.push([texts[i], room, len]);
    }
    if (!over.length) return;
    var st = getComputedStyle(over[0][0]), family = st.fontStyle + " " + st.fontWeight + " ";
    measurer = measurer || document.createElement("canvas").getContext("2d");
    var width = function (s, f) { measurer.font = family + f + "px " + st.fontFamily; return measurer.measureText(s).width; };
    over.forEach(function (e) {
      var t = e[0], name = t.getAttribute("data-name"), marker = t.getAttribute("data-marker") || "";
      var suffix = t.getAttribute("data-suffix") || "", choices = labelChoices(name, marker), at = -1;
      var drawnFont = parseFloat(t.style.fontSize) || 12, drawn = width(t.textContent, drawnFont);
      var ratio = drawn > 0 ? e[2] / drawn : 1;  // the SVG text's width against the canvas's, for this label's text
      var fits = function (s, f) { return width(s, f) * ratio <= e[1]; };
      for (var c = 0; c < choices.length; c++) if (choices[c][0] === t.textContent && choices[c][1] === drawnFont) at = c;
      if (at >= 0) {  // the estimate picked one of the choices: try the rest, measured
        for (c = at + 1; c < choices.length; c++) {
          if (fits(choices[c][0], choices[c][1])) { setLabel(t, choices[c][0], choices[c][1]); return; }
        }
      }
      // A cut label, measured: the one that keeps the most of the name, at any font (the larger on a tie).
      var best = null;
      FONTS.forEach(function (f) {
        for (var max = Math.floor(e[1] / (CHAR * f / 12)) + 1; max >= 0; max--) {
          var label = shorten(name, max, marker, suffix);
          if (!label || (best && label.length <= best[0].length)) return;
          if (fits(label, f)) { best = [label, f]; return; }
        }
      });
      if (!best) { t.remove(); return; }
      setLabel(t, best[0], best[1]);
    });
  }
  function setLabel(t, label, font) {
    t.textContent = label;
    t.style.fontSize = font === 12 ? "" : font + "px";
  }

  /* opts: { parent, label(i), status(i), width(i) -> value, colour(i) -> value, colourKind,
             tooltip(i, info) -> array of [name, text], onZoom(i), mark(i) -> extra class of node i (optional) } */
  function Icicle(container, opts) {
    this.container = container;
    this.opts = opts;
    this.zoom = 0;
    this.svg = null;
    // The tooltip lives on <body> with fixed positioning: the icicle's box clips its overflow (the drawing
    // is as wide as the page), and a tooltip inside it would be cut to the rows below the pointer.
    this.tip = document.createElement("div");
    this.tip.className = "cbsite-tip";
    this.tip.setAttribute("role", "tooltip");
    this.tip.hidden = true;
    document.body.appendChild(this.tip);
    var self = this;
    // The kind of the last pointer pressed (mouse, pen, touch): a tap has no hover, so it is told apart. A press
    // outside the icicle hides a tapped tooltip and disarms its node.
    this.pointer = "mouse";
    this.armed = -1;
    document.addEventListener("pointerdown", function (e) {
      self.pointer = e.pointerType || "mouse";
      if (!container.contains(e.target)) { self.armed = -1; if (self.pointer === "touch") self.tip.hidden = true; }
    }, true);
    if (typeof MutationObserver !== "undefined" && document.body) {  // the palette toggle: redraw in the new scheme
      var wasDark = dark();
      new MutationObserver(function () { if (dark() !== wasDark) { wasDark = dark(); self.render(); } })
        .observe(document.body, { attributes: true, attributeFilter: ["data-md-color-scheme"] });
    }
    if (typeof ResizeObserver !== "undefined") {
      // Its first call, just after the first render, finds the width drawn: no second drawing of the same icicle.
      this.drawnWidth = 0;
      new ResizeObserver(function () {
        var w = container.clientWidth;
        if (w && Math.abs(w - self.drawnWidth) > 2) self.render();
      }).observe(container);
    }
    this._listen(container);
  }

  /* One listener per kind of event on the container, not six per box (a large run draws thousands of boxes, each
     drawing again on every zoom): click, Enter, hover, focus and their ends, found from the event's target. An
     ancestor row zooms out to it, a node zooms (a second tap on a touch screen), a self share only tells its share. */
  Icicle.prototype._listen = function (container) {
    var self = this;
    var nodeOf = function (target) {
      var g = target && target.closest ? target.closest("g.cbsite-node") : null;
      return g && container.contains(g) ? g : null;
    };
    var what = function (g) {  // [index, layout or null (an ancestor row), whether a self share]
      if (g.cbsiteSelfOf !== undefined) return [g.cbsiteSelfOf, self.layout, true];
      var k = +g.getAttribute("data-index");
      return [k, g.classList.contains("ancestor") ? null : self.layout, false];
    };
    var go = function (k) {  // clicking the zoomed node backs out one level; any other node zooms in
      if (k === self.zoom && self.opts.parent[k] >= 0) self.zoomTo(self.opts.parent[k]); else self.zoomTo(k);
    };
    container.addEventListener("click", function (e) {
      var g = nodeOf(e.target);
      if (!g) return;
      var w = what(g), k = w[0];
      if (w[2] || k < 0) return;
      if (!w[1]) { self.zoomTo(k); return; }
      // A touch screen has no hover: the first tap on a node shows its numbers, a second tap zooms.
      if (self.pointer === "touch" && self.armed !== k) {
        self.armed = k;
        var r = g.getBoundingClientRect();
        self._showTip({ clientX: Math.min(e.clientX || r.left, r.right), clientY: r.bottom - 4 }, self.opts.tooltip(k, self._info(k, w[1])));
        return;
      }
      self.armed = -1;
      go(k);
    });
    container.addEventListener("keydown", function (e) {
      var g = nodeOf(e.target);
      if (g && (e.key === "Enter" || e.key === " ")) {
        var w = what(g);
        if (!w[2] && w[0] >= 0 && w[1]) { e.preventDefault(); go(w[0]); self._focus(w[0]); }
      }
      self._key(e);
    });
    container.addEventListener("mousemove", function (e) {
      var g = nodeOf(e.target);
      if (!g) return;
      var w = what(g), k = w[0], L = w[1];
      if (w[2]) {
        var share = L.size[k] > 0 ? (L.size[k] - L.childSum[k]) / L.size[k] : 0;
        self._showTip(e, [["", "self share of " + self.opts.label(k)],
                          ["share", (share * 100).toPrecision(3) + "% of the node, not in any child"]]);
      } else if (k >= 0 && self.pointer !== "touch") self._showTip(e, self.opts.tooltip(k, self._info(k, L)));
    });
    container.addEventListener("mouseout", function (e) {
      var g = nodeOf(e.target);
      if (!g || nodeOf(e.relatedTarget) === g) return;  // within the same box: no leaving
      if (what(g)[2] || self.pointer !== "touch") self.tip.hidden = true;
    });
    container.addEventListener("focusin", function (e) {
      var g = nodeOf(e.target);
      if (!g || g !== e.target) return;
      var w = what(g);
      if (w[2] || w[0] < 0) return;
      var r = g.getBoundingClientRect();
      self._showTip({ clientX: r.left + Math.min(r.width / 2, 40), clientY: r.bottom - 4 }, self.opts.tooltip(w[0], self._info(w[0], w[1])));
    });
    container.addEventListener("focusout", function (e) {
      var g = nodeOf(e.target);
      if (g && g === e.target) self.tip.hidden = true;
    });
  };

  Icicle.prototype.setOptions = function (opts) {
    for (var k in opts) if (Object.prototype.hasOwnProperty.call(opts, k)) this.opts[k] = opts[k];
    this.render();
  };

  Icicle.prototype.zoomTo = function (i) {
    this.zoom = i;
    this.armed = -1;
    this.tip.hidden = true;  // it described a box that moves now
    this.render();
    if (this.opts.onZoom) this.opts.onZoom(i);
  };

  Icicle.prototype.render = function () {
    var o = this.opts, parent = o.parent, n = parent.length;
    var values = new Array(n), colours = new Array(n);
    for (var i = 0; i < n; i++) { values[i] = o.width(i); colours[i] = o.colour(i); }
    var L = layout(parent, values, this.zoom);
    var shown = L.nodes.map(function (k) { return colours[k]; });
    var sc = scale(shown, o.colourKind, o.ramp, o.categories);
    this.scale = sc;
    var anc = ancestors(parent, this.zoom);
    var W = Math.max(this.container.clientWidth, 200);
    var H = (anc.length + L.maxDepth + 1) * ROW + 2;
    if (this.svg) this.svg.remove();
    var svg = el("svg", { width: W, height: H, "class": "cbsite-icicle-svg", role: "img",
                          "aria-label": "icicle of the component tree" });
    var defs = el("defs", {}, svg);
    var hatch = el("pattern", { id: "cbsite-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                                patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 6, height: 6, fill: "#ffffff", "fill-opacity": "0" }, hatch);
    var F = fills();
    el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: F.hatch, "stroke-width": 1.5, "stroke-opacity": 0.45 }, hatch);
    var self = this;
    var kids = {};
    L.nodes.forEach(function (k) { if (k !== self.zoom && parent[k] >= 0) (kids[parent[k]] = kids[parent[k]] || []).push(k); });
    var suffixes = {};
    Object.keys(kids).forEach(function (p) {
      var names = kids[p].map(function (k) { return o.label(k); }), sx = siblingSuffixes(names);
      kids[p].forEach(function (k, j) { if (sx[names[j]]) suffixes[k] = sx[names[j]]; });
    });
    var place = {};  // node -> [row, x] of its box, for the arrow keys
    var draw = function (k, x, w, row, cls, fill) {
      var g = el("g", { "class": "cbsite-node " + cls, "data-index": k, transform: "translate(" + x + "," + row * ROW + ")" }, svg);
      if (k >= 0) place[k] = [row, x];
      el("rect", { width: Math.max(w - 1, 0.5), height: ROW - 2, fill: fill, rx: 2 }, g);
      if (cls.indexOf("estimated") >= 0 || cls.indexOf("failed") >= 0 || cls.indexOf("self") >= 0) {
        el("rect", { width: Math.max(w - 1, 0.5), height: ROW - 2, fill: "url(#cbsite-hatch)", "class": "mark", rx: 2 }, g);
      }
      // Children that add up to more than the node: a black line and a white one inside it, so that one of the
      // two contrasts with whatever fill the colouring gives the node, in either scheme (cbsite.css).
      if (/(^| )overflow( |$)/.test(cls) && w > 6) {
        el("rect", { x: 1, y: 1, width: w - 3, height: ROW - 4, rx: 2, "class": "overflow-line outer" }, g);
        el("rect", { x: 2.5, y: 2.5, width: w - 6, height: ROW - 7, rx: 1, "class": "overflow-line inner" }, g);
      }
      if (k >= 0) {  // a focusable node: Tab reaches it, Enter zooms, focus shows its tooltip
        g.setAttribute("tabindex", "0");
        g.setAttribute("role", "button");
        g.setAttribute("aria-label", o.label(k));
      }
      var marker = cls.indexOf("failed") >= 0 ? "\u2715 " : cls.indexOf("estimated") >= 0 ? "\u2248 " : "";
      var name = k < 0 ? "self" : o.label(k), suffix = k >= 0 && suffixes[k] ? suffixes[k] : "";
      var label = null, font = 12;
      labelChoices(name, marker).some(function (c) {
        if (c[0].length * CHAR * c[1] / 12 <= w - 8) { label = c[0]; font = c[1]; return true; }
        return false;
      });
      // A name that fits none: cut (shorten), keeping the most of it at any font (the larger on a tie).
      if (label === null) FONTS.forEach(function (f) {
        var cut = shorten(name, Math.floor((w - 8) / (CHAR * f / 12)), marker, suffix);
        if (cut && (label === null || cut.length > label.length)) { label = cut; font = f; }
      });
      if (label) {
        var t = el("text", { x: 4, y: ROW - 8, fill: textOn(fill), "data-name": name, "data-marker": marker,
                             "data-suffix": suffix, "data-room": Math.max(w - 8, 0) }, g);
        if (font !== 12) t.style.fontSize = font + "px";
        t.textContent = label;
      }
      return g;
    };
    anc.forEach(function (k, row) {
      draw(k, 0, W, row, "ancestor status-" + o.status(k), F.ancestor);
    });
    var top = anc.length;
    for (var j = 0; j < L.nodes.length; j++) {
      var k = L.nodes[j];
      var x = L.x0[k] * W, w = (L.x1[k] - L.x0[k]) * W;
      var st = o.status(k);
      // A failed node has no value, hence no width: a thin marker keeps it visible where it sits.
      if (w < 0.5 && st === "failed") { x = Math.max(0, Math.min(x, W - 4)); w = 4; }
      else if (w < 0.5) continue;  // narrower than a pixel: drawn as part of its parent
      var row = top + L.depth[k];
      draw(k, x, w, row, "status-" + st + (k === this.zoom ? " zoom-root" : "") +
           (L.overflow[k] ? " overflow" : "") + (o.mark ? " " + (o.mark(k) || "") : ""), st === "skipped" ? F.skipped : sc.colour(colours[k]));
      // The self share: the part of a node its children do not cover, drawn in the row of its children.
      if (!isNaN(L.selfStart[k]) && (L.x1[k] - L.selfStart[k]) * W >= 1) {
        draw(-1, L.selfStart[k] * W, (L.x1[k] - L.selfStart[k]) * W, row + 1, "self", F.self).cbsiteSelfOf = k;
      }
    }
    this.container.appendChild(svg);
    this.drawnWidth = this.container.clientWidth;
    fitLabels(svg);
    this.place = place;
    this.svg = svg;
    this.layout = L;
    if (o.onRender) o.onRender(this);
  };

  Icicle.prototype._showTip = function (evt, rows) {
    var tip = this.tip;
    tip.textContent = "";
    rows.forEach(function (r) {
      var line = document.createElement("div");
      if (r[0]) { var b = document.createElement("b"); b.textContent = r[0] + ": "; line.appendChild(b); }
      line.appendChild(document.createTextNode(r[1]));
      if (r[2]) line.className = r[2];
      tip.appendChild(line);
    });
    tip.hidden = false;
    // Beside the pointer, flipped to its left or above it where the viewport ends: always whole and visible.
    var vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight, gap = 12;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var left = evt.clientX + gap, topPx = evt.clientY + gap;
    if (left + w > vw - 4) left = evt.clientX - gap - w;
    if (topPx + h > vh - 4) topPx = evt.clientY - gap - h;
    tip.style.left = Math.max(4, Math.min(left, vw - w - 4)) + "px";
    tip.style.top = Math.max(4, Math.min(topPx, vh - h - 4)) + "px";
  };

  /* Keys on a focused node: arrows move to the box beside, above (parent) or below (first child); Escape hides
     the tooltip and backs the zoom out one level. */
  Icicle.prototype._key = function (e) {
    var g = e.target && e.target.closest ? e.target.closest("g.cbsite-node") : null;
    if (!g || !this.place) return;
    var k = +g.getAttribute("data-index"), parent = this.opts.parent, place = this.place, to = -1;
    if (e.key === "Escape") {
      this.tip.hidden = true;
      if (this.zoom !== 0 && parent[this.zoom] >= 0) { var back = parent[this.zoom]; this.zoomTo(back); this._focus(back); }
      e.preventDefault();
      return;
    }
    if (!place[k]) return;
    if (e.key === "ArrowUp") to = parent[k] >= 0 && place[parent[k]] ? parent[k] : -1;
    else if (e.key === "ArrowDown") {
      for (var c in place) if (parent[+c] === k && (to < 0 || place[+c][1] < place[to][1])) to = +c;
    } else if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      var right = e.key === "ArrowRight", row = place[k][0], x = place[k][1];
      for (var d in place) {
        var p = place[+d];
        if (+d === k || p[0] !== row || (right ? p[1] <= x : p[1] >= x)) continue;
        if (to < 0 || (right ? p[1] < place[to][1] : p[1] > place[to][1])) to = +d;
      }
    } else return;
    e.preventDefault();
    if (to >= 0) this._focus(to);
  };

  /* Keyboard focus back on node k after a redraw (the old element is gone). */
  Icicle.prototype._focus = function (k) {
    var g = this.svg && this.svg.querySelector("g.cbsite-node[data-index='" + k + "']");
    if (g && g.focus) g.focus();
  };

  /* What the tooltip of node k says beside its own row: its share of the parent, its self share, overflow. */
  Icicle.prototype._info = function (k, L) {
    var parent = this.opts.parent;
    return { layout: L, overflow: L ? L.overflow[k] : 0,
             share: L && parent[k] >= 0 && L.size[parent[k]] > 0 ?
               L.size[k] / Math.max(L.size[parent[k]], L.childSum[parent[k]]) : null,
             self: L && L.size[k] > L.childSum[k] && L.childSum[k] > 0 ? (L.size[k] - L.childSum[k]) / L.size[k] : null };
  };

  var api = { layout: layout, ancestors: ancestors, scale: scale, Icicle: Icicle, RAMPS: RAMPS, RAMPS_DARK: RAMPS_DARK,
              NONE: NONE, DIV_DARK: DIV_DARK, fills: fills, dark: dark,
              contrast: contrast, textOn: textOn, shorten: shorten, mix: mix, siblingSuffixes: siblingSuffixes };
  global.CbsiteIcicle = api;
  if (typeof module !== "undefined" && module.exports) module.exports = api;
})(typeof window !== "undefined" ? window : globalThis);
