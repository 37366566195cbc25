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
  function renderAll() {
    var els = document.querySelectorAll("[data-cbsite-chart]");
    Array.prototype.forEach.call(els, function (el) {
      specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
        var spec = all[el.getAttribute("data-cbsite-chart")];
        if (!spec) return;
        var opts = { actions: false, renderer: "svg" };
        if (dark()) {
          opts.theme = "dark";
          spec = JSON.parse(JSON.stringify(spec));
          spec.config = Object.assign({}, spec.config, { background: "transparent" });
        }
        return window.cbsiteVegaEmbed(el, spec, opts);
      }).catch(function (err) {
        el.textContent = "chart unavailable: " + err.message;
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
  // The palette toggle switches the scheme on <body>: draw the charts again in the new one.
  if (typeof MutationObserver !== "undefined") {
    var was = null;
    new MutationObserver(function () { var now = dark(); if (was !== null && now !== was) renderAll(); was = now; })
      .observe(document.body, { attributes: true, attributeFilter: ["data-md-color-scheme"] });
  }
})();
