/* A study page's charts: charts.json holds {"<axis>|<metric>": {"linear": spec, "log": spec}}; every element with
   data-cbsite-study-chart gets its spec, and the page's log-scale checkbox swaps every chart to the other one.
   Each spec is Vega, compiled when the site was built; charts.js (loaded before this file) draws them: lazily, in
   the page's scheme, with the Vega runtime loaded on need. */
(function () {
  "use strict";
  var all = null;
  var views = [];
  var generation = 0;  // each draw's number: a chart that comes near after a newer draw is that draw's to embed
  function draw(scale) {
    views.forEach(function (v) { v.finalize(); });
    views = [];
    var now = ++generation, C = window.CbsiteCharts;
    var els = document.querySelectorAll("[data-cbsite-study-chart]");
    Array.prototype.forEach.call(els, function (el) {
      var spec = all[el.getAttribute("data-cbsite-study-chart")];
      if (!spec) return;
      // Vega sets its container's label from the spec's description: keep the page's name of the chart (what it shows).
      var name = el.getAttribute("data-cbsite-name") || el.getAttribute("aria-label");
      if (name) el.setAttribute("data-cbsite-name", name);
      // Drawn when it nears the viewport, in the page's scheme, with Vega loaded on the first chart's need (charts.js).
      C.reserve(el, spec[scale]);
      C.whenNear(el, function () {
        if (now !== generation) return;
        C.embed(el, spec[scale]).then(function (r) {
          el.style.minHeight = "";
          el.setAttribute("data-cbsite-scale", scale);
          if (name) el.setAttribute("aria-label", name);
          if (now === generation) views.push(r); else r.finalize();
        }).catch(function (err) { el.textContent = "chart unavailable: " + err.message; });
      });
    });
  }
  function start() {
    var box = document.getElementById("cbsite-study-log");
    fetch("charts.json").then(function (r) {
      if (!r.ok) throw new Error("charts.json: " + r.status);
      return r.json();
    }).then(function (specs) {
      all = specs;
      draw(box && box.checked ? "log" : "linear");
      if (box) box.addEventListener("change", function () { draw(box.checked ? "log" : "linear"); });
      // The palette toggle switches the scheme on <body>: draw the charts again in the new one.
      if (window.CbsiteCharts) window.CbsiteCharts.onSchemeChange(function () { draw(box && box.checked ? "log" : "linear"); });
    }).catch(function (err) {
      Array.prototype.forEach.call(document.querySelectorAll("[data-cbsite-study-chart]"), function (el) {
        el.textContent = "chart unavailable: " + err.message;
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
