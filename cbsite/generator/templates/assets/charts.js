/* Render the charts of a page: every element with data-cbsite-chart="KEY" gets spec KEY of the JSON file named by
   its data-cbsite-specs attribute, once its box nears the viewport (a chart inside a closed <details> waits until
   it is opened). Two kinds of spec, each drawn by its own offline bundle beside this file (charts.py), loaded on the
   first chart's need and never by a script tag: a Vega spec (the model and study pages', compiled from Vega-Lite when
   the site was built) by the Vega runtime alone, vega.js; a Vega-Lite spec (the diff page's contributors) by
   vega-embed, vega-lite.js, which only diff pages load. */
(function () {
  "use strict";
  var cache = {};
  var here = document.currentScript && document.currentScript.src;
  /* The bundles: each file and the global it defines (vega.js: {View, parse}; vega-lite.js: {embed}). */
  var BUNDLES = { vega: { file: "vega.js", api: "cbsiteVega" }, vegaLite: { file: "vega-lite.js", api: "cbsiteVegaLite" } };
  var loading = {};
  /* A bundle's API, loaded once, on first need. */
  function bundle(kind) {
    var b = BUNDLES[kind];
    if (window[b.api]) return Promise.resolve(window[b.api]);
    if (!loading[kind]) loading[kind] = new Promise(function (resolve, reject) {
      var s = document.createElement("script");
      s.src = here ? here.replace(/charts\.js(\?.*)?$/, b.file) : b.file;
      s.onload = function () { window[b.api] ? resolve(window[b.api]) : reject(new Error(b.file + " defined no chart renderer")); };
      s.onerror = function () { loading[kind] = null; reject(new Error(s.src + " did not load")); };
      document.head.appendChild(s);
    });
    return loading[kind];
  }
  function vega() { return bundle("vega"); }
  function isVega(spec) { return Array.isArray(spec.marks); }
  /* The bundle that draws `spec`. */
  function bundleFor(spec) { return bundle(isVega(spec) ? "vega" : "vegaLite"); }
  /* Call `draw` once `el` nears the viewport (a screen ahead), or at once where IntersectionObserver is missing. */
  function whenNear(el, draw) {
    if (typeof IntersectionObserver === "undefined") { draw(); return; }
    var seen = new IntersectionObserver(function (entries) {
      if (!entries.some(function (e) { return e.isIntersecting; })) return;
      seen.disconnect();
      draw();
    }, { rootMargin: "100% 0px" });
    seen.observe(el);
  }
  function nextTask() { return new Promise(function (go) { setTimeout(go, 0); }); }
  /* Draw `spec` in `el` in the page's scheme, loading its bundle first where needed; resolves to {view, finalize}.
     Charts are drawn one at a time, and each in two tasks (its dataflow built, then run and painted): several
     charts near at once were one long task, and the first was painted only when the last was drawn. */
  var turn = Promise.resolve();
  function embed(el, spec) {
    var drawn = turn.then(nextTask).then(function () { return bundleFor(spec); }).then(function (api) {
      var scheme = dark() ? "dark" : "light";
      return (isVega(spec) ? drawVega(api, el, spec) : embedVegaLite(api, el, spec)).then(function (result) {
        el.setAttribute("data-cbsite-scheme", scheme);  // what it was drawn in: a chart far away is redrawn when near
        return result;
      });
    });
    turn = drawn.catch(function () {});  // the next chart waits for this one, drawn or failed
    return drawn;
  }
  /* A Vega spec drawn as SVG by the Vega runtime, its tooltips shown by `tooltip`; the element's earlier drawing is
     replaced. */
  function drawVega(V, el, spec) {
    var view = new V.View(V.parse(vegaSpec(spec), dark() ? DARK_CONFIG : undefined), { renderer: "svg", tooltip: tooltip });
    return nextTask().then(function () {
      if (el.cbsiteView) el.cbsiteView.finalize();
      el.cbsiteView = view;
      el.textContent = "";
      return view.initialize(el).runAsync();
    }).then(function () {
      return { view: view, finalize: function () { view.finalize(); } };
    });
  }
  /* A Vega-Lite spec compiled and drawn as SVG by vega-embed (its own tooltips). */
  function embedVegaLite(VL, el, spec) {
    var t = themed(spec);
    return VL.embed(el, t[0], t[1]);
  }
  function specs(url) {
    if (!cache[url]) cache[url] = fetch(url).then(function (r) {
      if (!r.ok) throw new Error(url + ": " + r.status);
      return r.json();
    });
    return cache[url];
  }
  /* Material's dark scheme ("slate") gets Vega's dark theme on a transparent background, never a white box. */
  function dark() {
    var scheme = document.body && document.body.getAttribute("data-md-color-scheme");
    return scheme === "slate";
  }
  /* The dark scheme: Vega's dark theme (light text, as vega-themes' "dark" compiles to Vega) on a transparent
     background, grid lines dimmer than the data, and mid greys and the dark blue lighter. */
  var DARK_CONFIG = {
    axis: { domainColor: "#8a8f99", gridColor: "#3a3f4b", gridOpacity: 1, tickColor: "#8a8f99" },
    style: { "guide-label": { fill: "#fff" }, "guide-title": { fill: "#fff" }, "group-title": { fill: "#fff" }, cell: { stroke: "#888" } },
    title: { subtitleColor: "#fff" }
  };
  var DARK_INK = { "#555555": "#c8c8c8", "#1f6fb4": "#4a9bd9" };
  function lighterInk(spec) {
    (function walk(node) {
      if (Array.isArray(node)) { node.forEach(function (v, k) { if (typeof v === "string" && DARK_INK[v]) node[k] = DARK_INK[v]; else walk(v); }); return; }
      if (!node || typeof node !== "object") return;
      Object.keys(node).forEach(function (k) {
        if (k === "data") return;  // values are data, not colours
        var v = node[k];
        if (typeof v === "string" && DARK_INK[v] && (k === "color" || k === "stroke" || k === "fill" || k === "value")) node[k] = DARK_INK[v];
        else walk(v);
      });
    })(spec);
    return spec;
  }
  /* A Vega spec for the page's scheme now (copied before it is changed). */
  function vegaSpec(spec) {
    if (!dark()) return spec;
    var copy = lighterInk(JSON.parse(JSON.stringify(spec)));
    copy.background = "transparent";
    return copy;
  }
  /* A Vega-Lite spec and vega-embed's options for the page's scheme now: [spec, options]. */
  function themed(spec) {
    var opts = { actions: false, renderer: "svg" };
    if (!dark()) return [spec, opts];
    opts.theme = "dark";
    var copy = lighterInk(JSON.parse(JSON.stringify(spec)));
    copy.config = Object.assign({}, copy.config, { background: "transparent" });
    copy.config.axis = Object.assign({}, DARK_CONFIG.axis, copy.config.axis);
    return [copy, opts];
  }
  /* Tooltips as vega-embed's vega-tooltip drew them (the same element, rows and light look), without its code: beside
     the pointer, kept inside the window; a value object is a table of its keys and values. */
  var tip = null;
  var TIP_STYLE = "#vg-tooltip-element{visibility:hidden;padding:8px;position:fixed;z-index:1000;font-family:sans-serif;" +
    "font-size:11px;border-radius:3px;box-shadow:2px 2px 4px rgba(0,0,0,.1);background-color:rgba(255,255,255,.95);" +
    "border:1px solid #d9d9d9;color:black;pointer-events:none}#vg-tooltip-element.visible{visibility:visible}" +
    "#vg-tooltip-element h2{margin-top:0;margin-bottom:10px;font-size:13px}#vg-tooltip-element table{border-spacing:0}" +
    "#vg-tooltip-element td{overflow:hidden;text-overflow:ellipsis;padding-top:2px;padding-bottom:2px}" +
    "#vg-tooltip-element td.key{color:#808080;max-width:150px;text-align:right;padding-right:4px}" +
    "#vg-tooltip-element td.value{display:block;max-width:300px;max-height:7em;text-align:left}";
  function tooltip(handler, event, item, value) {
    if (!tip) {
      var style = document.createElement("style");
      style.textContent = TIP_STYLE;
      document.head.appendChild(style);
      tip = document.createElement("div");
      tip.id = "vg-tooltip-element";
      tip.className = "vg-tooltip light-theme";
      document.body.appendChild(tip);
    }
    if (value == null || value === "") { tip.classList.remove("visible"); return; }
    tip.textContent = "";
    if (typeof value === "object" && !Array.isArray(value)) {
      var table = document.createElement("table");
      Object.keys(value).forEach(function (key) {
        if (value[key] === undefined) return;
        var text = value[key] !== null && typeof value[key] === "object" ? JSON.stringify(value[key]) : String(value[key]);
        if (key === "title") { var h = document.createElement("h2"); h.textContent = text; tip.appendChild(h); return; }
        var row = table.insertRow(), k = row.insertCell(), v = row.insertCell();
        k.className = "key"; k.textContent = key;
        v.className = "value"; v.textContent = text;
      });
      tip.appendChild(table);
    } else {
      tip.textContent = String(value);
    }
    tip.classList.add("visible");
    var box = tip.getBoundingClientRect(), x = event.clientX + 10, y = event.clientY + 10;
    if (x + box.width > window.innerWidth) x = Math.max(0, event.clientX - 10 - box.width);
    if (y + box.height > window.innerHeight) y = Math.max(0, event.clientY - 10 - box.height);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  /* Call `redraw` when the palette toggle switches the scheme on <body>. */
  function onSchemeChange(redraw) {
    if (typeof MutationObserver === "undefined") return;
    var was = dark();
    new MutationObserver(function () { var now = dark(); if (now !== was) { was = now; redraw(); } })
      .observe(document.body, { attributes: true, attributeFilter: ["data-md-color-scheme"] });
  }
  /* Vega draws a point with an `href` (a trend's run) as a plain SVG path: a click opens it, the keyboard cannot reach
     it. Each becomes a link for the keyboard: one tab stop per chart, arrow keys move along the points, Enter opens. */
  function linkPoints(el, view) {
    var items = [];
    (function walk(node) {
      if (!node) return;
      if (node.href && node._svg) items.push(node);
      if (node.items) node.items.forEach(walk);
    })(view.scenegraph().root);
    if (!items.length) return;
    items.sort(function (a, b) { return (a.x - b.x) || (a.y - b.y); });
    var at = 0;
    items.forEach(function (item, k) {
      var node = item._svg;
      node.setAttribute("tabindex", k === 0 ? "0" : "-1");
      node.setAttribute("role", "link");
      node.classList.add("cbsite-chart-link");
      node.addEventListener("focus", function () { at = k; node.setAttribute("stroke", "currentColor"); node.setAttribute("stroke-width", "2"); });
      node.addEventListener("blur", function () { node.removeAttribute("stroke"); });
      node.addEventListener("keydown", function (e) {
        if (e.key === "Enter") { e.preventDefault(); location.assign(new URL(item.href, document.baseURI).href); return; }
        var step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[e.key];
        if (!step) return;
        e.preventDefault();
        var next = Math.max(0, Math.min(items.length - 1, at + step));
        node.setAttribute("tabindex", "-1");
        items[next]._svg.setAttribute("tabindex", "0");
        items[next]._svg.focus();
      });
    });
    el.setAttribute("data-cbsite-links", String(items.length));
  }
  function render(el) {
    specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
      var spec = all[el.getAttribute("data-cbsite-chart")];
      if (!spec) return;
      return embed(el, spec).then(function (result) {
        el.style.minHeight = "";
        linkPoints(el, result.view);
        el.setAttribute("data-cbsite-drawn", "1");
      });
    }).catch(function (err) {
      el.textContent = "chart unavailable: " + err.message;
    });
  }
  /* An empty box holds the chart's height (its plot, title and axes) until it is drawn: boxes of the page's
     minimum height would all count as near the viewport, and the page would jump as each is drawn. */
  function reserve(el, spec) {
    if (el.querySelector("svg")) return;
    // A Vega spec carries it (charts.py `reserved_height`); a Vega-Lite spec's is its plot's height and its title and axes.
    if (spec.usermeta && typeof spec.usermeta.height === "number") el.style.minHeight = spec.usermeta.height + "px";
    else if (typeof spec.height === "number") el.style.minHeight = (spec.height + 70) + "px";
  }
  function renderAll() {
    // A bundle starts loading as soon as a chart's box that needs it may be seen, before the charts ahead of it are
    // drawn; a page whose charts are all in closed sections loads none. The study page's charts are all Vega.
    // A failure to load is shown by the chart that needs it.
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-study-chart]"), function (el) {
      whenNear(el, function () { vega().catch(function () {}); });
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-chart]"), function (el) {
      specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
        var spec = all[el.getAttribute("data-cbsite-chart")];
        if (!spec) return;
        reserve(el, spec);
        whenNear(el, function () { bundleFor(spec).catch(function () {}); render(el); });
      }).catch(function (err) { el.textContent = "chart unavailable: " + err.message; });
    });
  }
  /* Scheme switches redraw the charts already drawn; the others are drawn in the new scheme when they come near. */
  function redrawDrawn() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-chart][data-cbsite-drawn]"), render);
  }
  // The study page's charts (study.js): its own Vega specs, drawn through the same theme, lazily and with Vega on need.
  window.CbsiteCharts = { onSchemeChange: onSchemeChange, whenNear: whenNear, reserve: reserve, vega: vega, embed: embed };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
  // The palette toggle switches the scheme on <body>: draw the charts again in the new one.
  if (document.body) onSchemeChange(redrawDrawn);
  else document.addEventListener("DOMContentLoaded", function () { onSchemeChange(redrawDrawn); });
})();
