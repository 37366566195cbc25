/* The run page's roofline, drawn as SVG from roofline.json (cbsite/generator/roofline.py) without Vega: log-log
   axes, the dashed bandwidth roof to the ridge then flat at peak FLOP/s, one point per leaf component and phase
   coloured by what bounds it. Hover or keyboard focus shows a point's numbers; a click or Enter opens the
   component (`#component=<path>`, which runlinks.js follows). The chart is one tab stop: arrow keys move along
   the points by intensity. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var NS = "http://www.w3.org/2000/svg";
  var HEIGHT = 320, FONT = 11;
  /* The dark scheme ("slate"): the compute blue lighter, as in the icicle's legend (charts.js did the same). */
  var DARK = { "#1f6fb4": "#4a9bd9" };
  var SHAPE_ORDER = ["forward", "backward"];
  var POINTS_PER_TASK = 400;

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(e);
    return e;
  }
  function dark() { return document.body && document.body.getAttribute("data-md-color-scheme") === "slate"; }
  function ink(colour) { return dark() && DARK[colour] ? DARK[colour] : colour; }

  /* Tick values on a log axis from lo to hi: 1, 2 and 5 times each power of ten where they fit in `most`
     ticks, else 1 and 5 times, else the powers of ten (every k-th decade on a narrow axis). */
  function logTicks(lo, hi, most) {
    var e0 = Math.floor(Math.log10(lo)), e1 = Math.ceil(Math.log10(hi));
    var sets = [[1, 2, 5], [1, 5], [1]];
    for (var s = 0; s < sets.length; s++) {
      var out = [];
      for (var e = e0; e <= e1; e++) {
        sets[s].forEach(function (m) {
          var v = Number((m * Math.pow(10, e)).toPrecision(6));
          if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(v);
        });
      }
      if (out.length <= most && out.length >= 2) return out;
      if (s === sets.length - 1) {
        var every = Math.max(1, Math.ceil(out.length / most));
        return out.filter(function (v) { return Math.round(Math.log10(v)) % every === 0; });
      }
    }
    return [];
  }
  /* FLOP per byte as plain decimals ("0.05", "0.2", "20", "1,000"): SI prefixes would read "50m". */
  var PLAIN = null;  // one formatter: making one per label costs more than the labels' drawing
  function plain(v) {
    PLAIN = PLAIN || new Intl.NumberFormat("en-US", { maximumFractionDigits: 12 });
    return PLAIN.format(Number(F.sig(v, 3)));
  }
  /* FLOP/s with an SI prefix and no unit on the axis ("500M", "2T"): the unit is in the title. */
  function si(v) { return F.rate(v); }

  function Roofline(box, data) {
    this.box = box;
    this.data = data;
    this.width = 0;
    this.focused = 0;
    // The tooltip is on <body> only while shown: the icicle has its own, and the page never holds two.
    this.tip = document.createElement("div");
    this.tip.className = "cbsite-tip";
    this.tip.setAttribute("role", "tooltip");
  }

  Roofline.prototype._hideTip = function () { if (this.tip.parentNode) this.tip.parentNode.removeChild(this.tip); };

  Roofline.prototype.draw = function (inParts) {
    var self = this, d = this.data, box = this.box, p = d.points;
    var width = Math.max(240, box.clientWidth || 0);
    this.width = box.clientWidth;
    this._hideTip();  // it described a point that moves now
    box.textContent = "";
    var narrow = width < 480;
    var m = { left: narrow ? 44 : 56, right: 10, top: 10, bottom: 40 };
    var w = width - m.left - m.right, h = HEIGHT - m.top - m.bottom;
    var lx0 = Math.log10(d.x[0]), lx1 = Math.log10(d.x[1]), ly0 = Math.log10(d.y[0]), ly1 = Math.log10(d.y[1]);
    function X(v) { return m.left + (Math.log10(v) - lx0) / (lx1 - lx0) * w; }
    function Y(v) { return m.top + (1 - (Math.log10(v) - ly0) / (ly1 - ly0)) * h; }
    var n = p.path.length;
    var svg = el("svg", { width: width, height: HEIGHT, "class": "cbsite-roofline-svg", role: "group", "font-size": FONT,
      "aria-label": "Roofline: " + n + " points, arithmetic intensity from " + plain(d.x[0]) + " to " + plain(d.x[1]) +
        " FLOP per byte, achieved FLOP/s from " + si(d.y[0]) + " to " + si(d.y[1]) + "; arrow keys move between points, Enter opens one" });
    svg.style.display = "block";
    svg.style.color = "var(--md-default-fg-color, #222222)";
    box.appendChild(svg);

    // The grid and the axes: ticks and labels in the page's text colour, the grid a faint tint of it.
    var grid = el("g", { "class": "cbsite-roof-grid", stroke: "currentColor", "stroke-opacity": 0.12 }, svg);
    var axes = el("g", { "class": "cbsite-roof-axes", fill: "currentColor" }, svg);
    var xt = logTicks(d.x[0], d.x[1], Math.max(3, Math.floor(w / 55))), yt = logTicks(d.y[0], d.y[1], Math.max(3, Math.floor(h / 32)));
    var xAxis = el("g", { "class": "cbsite-roof-x", "data-domain": d.x.join(" ") }, axes);
    xt.forEach(function (v) {
      el("line", { x1: X(v), x2: X(v), y1: m.top, y2: m.top + h }, grid);
      el("line", { x1: X(v), x2: X(v), y1: m.top + h, y2: m.top + h + 4, stroke: "currentColor" }, xAxis);
      el("text", { x: X(v), y: m.top + h + 15, "text-anchor": "middle" }, xAxis).textContent = plain(v);
    });
    var yAxis = el("g", { "class": "cbsite-roof-y", "data-domain": d.y.join(" ") }, axes);
    yt.forEach(function (v) {
      el("line", { x1: m.left, x2: m.left + w, y1: Y(v), y2: Y(v) }, grid);
      el("line", { x1: m.left - 4, x2: m.left, y1: Y(v), y2: Y(v), stroke: "currentColor" }, yAxis);
      el("text", { x: m.left - 6, y: Y(v) + 4, "text-anchor": "end" }, yAxis).textContent = si(v);
    });
    el("rect", { "class": "cbsite-roof-plot", x: m.left, y: m.top, width: w, height: h, fill: "none", stroke: "currentColor", "stroke-opacity": 0.5 }, axes);
    el("text", { x: m.left + w / 2, y: HEIGHT - 6, "text-anchor": "middle" }, axes).textContent =
      narrow ? "FLOP per byte moved" : "arithmetic intensity (FLOP per byte moved)";
    el("text", { transform: "translate(12," + (m.top + h / 2) + ") rotate(-90)", "text-anchor": "middle" }, axes).textContent =
      narrow ? "FLOP/s (per call)" : "achieved FLOP/s (per call)";

    // The roofs: the bandwidth roof to the ridge, then peak FLOP/s; the ridge a dotted rule with its numbers.
    if (d.roof) {
      var roofs = el("g", { "class": "cbsite-roofs", stroke: "currentColor", "stroke-opacity": 0.75, fill: "none" }, svg);
      el("path", { "class": "cbsite-roof", "stroke-dasharray": "4 3", "stroke-width": 1.5,
        d: d.roof.map(function (q, i) { return (i ? "L" : "M") + X(q[0]).toFixed(1) + "," + Y(q[1]).toFixed(1); }).join("") }, roofs);
      var ridge = el("line", { "class": "cbsite-ridge", x1: X(d.ridge), x2: X(d.ridge), y1: Y(d.peak_flops), y2: m.top + h, "stroke-dasharray": "2 2" }, roofs);
      el("title", {}, ridge).textContent = "ridge: " + plain(d.ridge) + " FLOP/byte: peak " + F.flops(d.peak_flops) + "/s, " + F.bytes(d.peak_bandwidth) + "/s";
      var peak = el("text", { "class": "cbsite-roof-label", x: m.left + w - 4, y: Y(d.peak_flops) - 4, "text-anchor": "end", fill: "currentColor", stroke: "none" }, roofs);
      peak.textContent = "peak " + F.flops(d.peak_flops) + "/s";
    }

    // The points: a link each (click or Enter opens the component); only the focused one is a tab stop. `inParts`:
    // made a few hundred per task (the first drawing, in idle time), their layer put in the chart once all are made.
    var layer = el("g", { "class": "cbsite-roof-points", "fill-opacity": 0.85, stroke: "none" });
    var order = [], links = [], drawing = this.drawing = (this.drawing || 0) + 1, next = 0;
    var part = function () {
      if (self.drawing !== drawing) return;  // drawn again since (a new width, the other scheme)
      var end = inParts ? Math.min(n, next + POINTS_PER_TASK) : n;
      for (var i = next; i < end; i++) {
        var path = p.path[i], colour = ink(d.bounds[p.bound[i]] || "#7f7f7f"), x = X(p.ai[i]), y = Y(p.flops_s[i]);
        var a = el("a", { href: "#component=" + encodeURIComponent(path), "class": "cbsite-roof-point", tabindex: -1,
          "data-index": i, "aria-label": (path || d.model) + " " + p.phase[i] + ", " + (p.bound[i] || "no bound") }, layer);
        var shape = SHAPE_ORDER.indexOf(p.phase[i]) === 1
          ? el("rect", { x: x - 3.8, y: y - 3.8, width: 7.6, height: 7.6 }, a)
          : el("circle", { cx: x, cy: y, r: 4.4 }, a);
        shape.setAttribute("fill", colour);
        links.push(a);
        order.push(i);
      }
      next = end;
      if (next < n) { setTimeout(part, 0); return; }
      order.sort(function (a, b) { return p.ai[a] - p.ai[b] || p.flops_s[a] - p.flops_s[b]; });
      self.links = links;
      self.order = order;
      if (links.length) links[order[Math.min(self.focused, n - 1)]].setAttribute("tabindex", 0);
      svg.appendChild(layer);
      svg.addEventListener("keydown", function (e) { self._key(e); });
      self._listen(layer);
      self._legend();
    };
    part();
  };

  /* The legend under the plot: the bounds' colours present in the data, then the phases' shapes. */
  Roofline.prototype._legend = function () {
    var d = this.data, legend = document.createElement("p");
    legend.className = "cbsite-legend cbsite-roofline-legend";
    function item(label) { var s = document.createElement("span"); legend.appendChild(s); s.appendChild(document.createTextNode(" " + label)); return s; }
    var lead = document.createElement("span"); lead.textContent = "bound by:"; legend.appendChild(lead);
    Object.keys(d.bounds).forEach(function (b) {
      var s = item(b), sw = document.createElement("span");
      sw.className = "cbsite-swatch";
      sw.style.background = ink(d.bounds[b]);
      s.insertBefore(sw, s.firstChild);
    });
    var phases = SHAPE_ORDER.filter(function (ph) { return d.points.phase.indexOf(ph) >= 0; });
    if (phases.length) {
      var lead2 = document.createElement("span"); lead2.textContent = "phase:"; legend.appendChild(lead2);
      phases.forEach(function (ph, k) {
        var s = item(ph), mark = el("svg", { width: 10, height: 10, "aria-hidden": "true" });
        mark.style.verticalAlign = "middle";
        if (k === 1) el("rect", { x: 1, y: 1, width: 8, height: 8, fill: "currentColor" }, mark);
        else el("circle", { cx: 5, cy: 5, r: 4.4, fill: "currentColor" }, mark);
        s.insertBefore(mark, s.firstChild);
      });
    }
    this.box.appendChild(legend);
  };

  Roofline.prototype._rows = function (i) {
    var p = this.data.points;
    return [["component", p.path[i] || this.data.model], ["phase", p.phase[i]], ["bound by", p.bound[i] || F.DASH],
      ["intensity", plain(p.ai[i]) + " FLOP/byte"], ["FLOP/s", F.flops(p.flops_s[i]) + "/s"],
      ["MFU", F.pct(p.mfu[i])], ["bandwidth utilisation", F.pct(p.bw[i])]];
  };

  Roofline.prototype._showTip = function (cx, cy, rows) {
    var tip = this.tip;
    tip.textContent = "";
    rows.forEach(function (r) {
      var line = document.createElement("div"), b = document.createElement("b");
      b.textContent = r[0] + ": ";
      line.appendChild(b);
      line.appendChild(document.createTextNode(r[1]));
      tip.appendChild(line);
    });
    if (!tip.parentNode) document.body.appendChild(tip);
    // Beside the point, flipped to its left or above it where the viewport ends: always whole and visible.
    var vw = document.documentElement.clientWidth, vh = document.documentElement.clientHeight, gap = 12;
    var w = tip.offsetWidth, h = tip.offsetHeight, left = cx + gap, top = cy + gap;
    if (left + w > vw - 4) left = cx - gap - w;
    if (top + h > vh - 4) top = cy - gap - h;
    tip.style.left = Math.max(4, Math.min(left, vw - w - 4)) + "px";
    tip.style.top = Math.max(4, Math.min(top, vh - h - 4)) + "px";
  };

  /* The points' hover and focus, one listener each on their layer (not four per point): entering or focusing a
     point shows its numbers beside it, leaving or blurring it hides them; the focused one is outlined. */
  Roofline.prototype._listen = function (layer) {
    var self = this;
    function pointOf(target) {
      var a = target && target.closest ? target.closest("a.cbsite-roof-point") : null;
      return a && layer.contains(a) ? a : null;
    }
    function near(a) { var r = a.getBoundingClientRect(); self._showTip(r.right, r.bottom, self._rows(+a.getAttribute("data-index"))); }
    layer.addEventListener("mouseover", function (e) {
      var a = pointOf(e.target);
      if (a && pointOf(e.relatedTarget) !== a) near(a);
    });
    layer.addEventListener("mouseout", function (e) {
      var a = pointOf(e.target);
      if (a && pointOf(e.relatedTarget) !== a) self._hideTip();
    });
    layer.addEventListener("focusin", function (e) {
      var a = pointOf(e.target);
      if (!a || a !== e.target) return;
      a.firstChild.setAttribute("stroke", "currentColor");
      a.firstChild.setAttribute("stroke-width", 2);
      near(a);
    });
    layer.addEventListener("focusout", function (e) {
      var a = pointOf(e.target);
      if (!a || a !== e.target) return;
      a.firstChild.setAttribute("stroke", "none");
      self._hideTip();
    });
  };

  /* Arrow keys move the focus along the points by intensity (Home, End: the ends); Escape hides the tooltip. */
  Roofline.prototype._key = function (e) {
    var step = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[e.key];
    if (e.key === "Escape") { this._hideTip(); return; }
    if (!step && e.key !== "Home" && e.key !== "End") return;
    e.preventDefault();
    var n = this.order.length;
    var pos = e.key === "Home" ? 0 : e.key === "End" ? n - 1 : Math.max(0, Math.min(n - 1, this.focused + step));
    this.links[this.order[this.focused]].setAttribute("tabindex", -1);
    this.focused = pos;
    var a = this.links[this.order[pos]];
    a.setAttribute("tabindex", 0);
    a.focus();
  };

  /* The roofline is below the first screen: it is drawn only when it nears the viewport (half a screen ahead), so
     opening a run page costs none of its 1,500 points. Until it is on the screen the browser skips its style, layout and paint (content-visibility), so a
     drawing off the screen costs its script only; its box keeps the chart's height meanwhile. */
  function start() {
    var box = document.querySelector("[data-cbsite-roofline]");
    if (!box) return;
    // The drawing's whole height is reserved, its legend included (.7rem lines, a little over 1.6 high for their marks,
    // 1em margins; two lines on a phone), so that drawing it never moves the table below while someone reads or clicks.
    var rem = parseFloat(getComputedStyle(document.documentElement).fontSize) || 16;
    var reserved = Math.ceil(HEIGHT + 0.7 * rem * ((box.clientWidth < 600 ? 2 : 1) * 1.75 + 2));
    box.style.minHeight = reserved + "px";
    box.style.contentVisibility = "auto";
    box.style.containIntrinsicSize = "auto " + reserved + "px";
    var url = box.getAttribute("data-cbsite-roofline"), wanted = false, chart = null, near = null;
    var json = fetch(url).then(function (r) {
      if (!r.ok) throw new Error(url + ": " + r.status);
      return r.json();
    });
    var show = function () {
      if (wanted) return;
      wanted = true;
      if (near) near.disconnect();
      json.then(function (data) {
        chart = new Roofline(box, data.roofline);
        chart.draw(true);
        window.cbsiteRoofline = chart;
        // Drawn again at a new width (a turned phone, a resized window) and in the other colour scheme.
        if (typeof ResizeObserver !== "undefined") {
          new ResizeObserver(function () { if (box.clientWidth && box.clientWidth !== chart.width) chart.draw(); }).observe(box);
        }
        if (typeof MutationObserver !== "undefined") {
          var was = dark();
          new MutationObserver(function () { if (dark() !== was) { was = dark(); chart.draw(); } })
            .observe(document.body, { attributes: true, attributeFilter: ["data-md-color-scheme"] });
        }
      }).catch(function (err) { box.textContent = "roofline unavailable: " + err.message; });
    };
    if (typeof IntersectionObserver !== "undefined") {
      near = new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; })) show();
      }, { rootMargin: "50% 0px" });
      near.observe(box);
    } else {
      show();  // no way to know when it nears the screen
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
