/* Render the Vega-Lite specs of a page: every element with data-cbsite-chart="KEY" gets spec KEY of the JSON
   file named by its data-cbsite-specs attribute. vega.js (the offline bundle) defines cbsiteVegaEmbed. */
(function () {
  "use strict";
  var cache = {};
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
  /* The dark scheme: a transparent background, grid lines dimmer than the data (Vega's dark grid is brighter than
     the roofline's #555 roofs), the roofs and ridge light grey, and the compute blue lighter (charts.py BOUND_COLOURS). */
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
  function renderAll() {
    var els = document.querySelectorAll("[data-cbsite-chart]");
    Array.prototype.forEach.call(els, function (el) {
      specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
        var spec = all[el.getAttribute("data-cbsite-chart")];
        if (!spec) return;
        var t = themed(spec);
        return window.cbsiteVegaEmbed(el, t[0], t[1]);
      }).catch(function (err) {
        el.textContent = "chart unavailable: " + err.message;
      });
    });
  }
  window.CbsiteCharts = { themed: themed, onSchemeChange: onSchemeChange };  // the study page's charts (study.js)
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
  // The palette toggle switches the scheme on <body>: draw the charts again in the new one.
  if (document.body) onSchemeChange(renderAll);
  else document.addEventListener("DOMContentLoaded", function () { onSchemeChange(renderAll); });
})();
