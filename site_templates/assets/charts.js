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
  function renderAll() {
    var els = document.querySelectorAll("[data-cbsite-chart]");
    Array.prototype.forEach.call(els, function (el) {
      specs(el.getAttribute("data-cbsite-specs")).then(function (all) {
        var spec = all[el.getAttribute("data-cbsite-chart")];
        if (!spec) return;
        return window.cbsiteVegaEmbed(el, spec, { actions: false, renderer: "svg" });
      }).catch(function (err) {
        el.textContent = "chart unavailable: " + err.message;
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", renderAll);
  else renderAll();
})();
