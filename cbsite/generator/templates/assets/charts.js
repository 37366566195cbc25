/* Render the Vega-Lite specs of a page: every element with data-cbsite-chart="KEY" gets spec KEY of the JSON
   file named by its data-cbsite-specs attribute, once its box nears the viewport (a chart inside a closed
   <details> waits until it is opened). vega.js (the offline bundle, beside this file) defines cbsiteVegaEmbed;
   a page without its script tag gets it loaded on the first chart's need. */
(function () {
  "use strict";
  var cache = {};
  var here = document.currentScript && document.currentScript.src;
  var vegaLoading = null;
  /* The embed function: the page's own vega.js, or the bundle loaded once, on first need. */
  function vega() {
    if (window.cbsiteVegaEmbed) return Promise.resolve(window.cbsiteVegaEmbed);
    if (!vegaLoading) vegaLoading = new Promise(function (resolve, reject) {
      var s = document.createElement("script");
      s.src = here ? here.replace(/charts\.js(\?.*)?$/, "vega.js") : "vega.js";
      s.onload = function () { window.cbsiteVegaEmbed ? resolve(window.cbsiteVegaEmbed) : reject(new Error("vega.js defined no chart renderer")); };
      s.onerror = function () { vegaLoading = null; reject(new Error(s.src + " did not load")); };
      document.head.appendChild(s);
    });
    return vegaLoading;
  }
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
  /* Embed `spec` in `el` in the page's scheme, loading Vega first where needed; resolves to vega-embed's result.
     Charts are drawn one at a time, each in a task of its own: several charts near at once were one long task,
     and the first was painted only when the last was drawn. */
  var turn = Promise.resolve();
  function embed(el, spec) {
    var drawn = turn.then(function () { return new Promise(function (go) { setTimeout(go, 0); }); }).then(vega).then(function (vegaEmbed) {
      var scheme = dark() ? "dark" : "light", t = themed(spec);
      return vegaEmbed(el, t[0], t[1]).then(function (result) {
        el.setAttribute("data-cbsite-scheme", scheme);  // what it was drawn in: a chart far away is redrawn when near
        return result;
      });
    });
    turn = drawn.catch(function () {});  // the next chart waits for this one, drawn or failed
    return drawn;
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
  /* The dark scheme: a transparent background, grid lines dimmer than the data (Vega's dark grid is bright), and
     mid greys and the dark blue lighter. */
  var DARK_INK = { "#555555": "#c8c8c8", "#1f6fb4": "#4a9bd9" };
  function darken(spec) {
    spec.config = Object.assign({}, spec.config, { background: "transparent" });
    spec.config.axis = Object.assign({ gridColor: "#3a3f4b", gridOpacity: 1, domainColor: "#8a8f99", tickColor: "#8a8f99" }, spec.config.axis);
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
  /* vega-embed's spec and options for the page's scheme now: [spec, options] (the spec copied before darkening). */
  function themed(spec) {
    var opts = { actions: false, renderer: "svg" };
    if (!dark()) return [spec, opts];
    opts.theme = "dark";
    return [darken(JSON.parse(JSON.stringify(spec))), opts];
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
    if (typeof spec.height === "number") { el.style.minHeight = (spec.height + 70) + "px"; return; }
    // A faceted chart (the study page's): its rows of panels, each the inner plot and its facet header.
    var inner = spec.spec, facet = spec.facet;
    if (!inner || typeof inner.height !== "number" || !facet) return;
    var panels = Array.isArray(facet.sort) ? facet.sort.length : 1, columns = spec.columns > 0 ? spec.columns : panels;
    el.style.minHeight = (Math.ceil(panels / columns) * (inner.height + 20) + 70) + "px";
  }
  function renderAll() {
    // The bundle starts loading as soon as a chart's box may be seen, beside the fetch of the specs, not after it;
    // a page whose charts are all in closed sections loads none of it.
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-chart], [data-cbsite-study-chart]"), function (el) {
      whenNear(el, function () { vega().catch(function () {}); });  // a failure is shown by the chart that needs it
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-chart]"), function (el) {
      specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
        var spec = all[el.getAttribute("data-cbsite-chart")];
        if (!spec) return;
        reserve(el, spec);
        whenNear(el, function () { render(el); });
      }).catch(function (err) { el.textContent = "chart unavailable: " + err.message; });
    });
  }
  /* Scheme switches redraw the charts already drawn; the others are drawn in the new scheme when they come near. */
  function redrawDrawn() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-chart][data-cbsite-drawn]"), render);
  }
  // The study page's charts (study.js): its own specs, drawn through the same theme, lazily and with Vega on need.
  window.CbsiteCharts = { themed: themed, onSchemeChange: onSchemeChange, whenNear: whenNear, reserve: reserve, vega: vega, embed: embed };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
  // The palette toggle switches the scheme on <body>: draw the charts again in the new one.
  if (document.body) onSchemeChange(redrawDrawn);
  else document.addEventListener("DOMContentLoaded", function () { onSchemeChange(redrawDrawn); });
})();
