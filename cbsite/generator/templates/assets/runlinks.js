/* The run page's address: a component it names opens (its row, its details, the icicle zoomed to its parent), and
   the rank, phase and zoom chosen are kept in it (CbsiteAddress). */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};
  var details = R.details;

  /* A component named by the address opens: `#component=<path>` (the slowest lists, the roofline, a shared
     link) or a search for its full path (Material's search adds `?h=<query>` to the result's address).
     The table is filtered to it, its row marked, its details shown and the icicle zoomed to its parent. */
  /* The component a search query names: the path itself; else, for a middle part of a path ("model.0._mlp",
     "_mlp.1": run.md.j2 indexes every tail of a path that starts after a dot), the first path in tree order that
     ends with it, else the first that holds it (search ignores case, so does this). */
  function queriedPath(d, q) {
    if (d.path.indexOf(q) >= 0) return q;
    var lower = q.toLowerCase(), holds = null;
    for (var i = 0; i < d.path.length; i++) {
      var p = d.path[i].toLowerCase(), at = p.lastIndexOf(lower);
      if (at < 0) continue;
      if (at + lower.length === p.length) return d.path[i];
      if (holds === null) holds = d.path[i];
    }
    return holds;
  }

  function linkedPath(d) {
    var hash = address.read();
    // #find=PATH: a component's own search entry (run.md.j2), reached without site.js's rewrite to #component=.
    if ("component" in hash) return hash.component;
    if ("find" in hash) return hash.find;
    var params = new URLSearchParams(location.search);
    var q = (params.get("find") || "").trim();  // the query a search result was clicked from (site.js)
    var found = q ? queriedPath(d, q) : null;
    if (found !== null) return found;
    // Material's ?h= lists the matched terms in no set order: a component whose dotted segments are
    // exactly those terms (the first in tree order, should several be).
    var terms = (params.get("h") || "").split(/[\s+]+/).filter(Boolean).sort().join(" ");
    if (!terms) return null;
    for (var i = 0; i < d.path.length; i++) {
      if (d.path[i] && d.path[i].split(".").slice().sort().join(" ") === terms) return d.path[i];
    }
    return null;
  }

  function openLinked(d) {
    var path = linkedPath(d);
    if (path === null) return;
    var i = d.path.indexOf(path);
    if (i < 0) return;
    var run = window.cbsiteRun, input = document.querySelector("#cbsite-table input.cbsite-filter");
    var filterTo = function (text) { if (input) { input.value = text; input.dispatchEvent(new Event("input")); } };
    var rowOf = function () { return document.querySelector("#cbsite-table tbody tr[data-index='" + i + "']"); };
    // A middle part searched for lists every component that holds it, where the one opened is on the page shown.
    var q = (new URLSearchParams(location.search).get("find") || "").trim();
    filterTo(q && q !== path && path.toLowerCase().indexOf(q.toLowerCase()) >= 0 ? q : path);
    var row = rowOf();
    if (!row && input && input.value !== path) { filterTo(path); row = rowOf(); }
    Array.prototype.forEach.call(document.querySelectorAll("#cbsite-table tr.cbsite-linked"), function (r) { r.classList.remove("cbsite-linked"); });
    if (row) row.classList.add("cbsite-linked");
    if (d.parent[i] >= 0) run.icicle.zoomTo(d.parent[i]);
    details(document.getElementById("cbsite-details"), d, i, run.ops);
    (row || document.getElementById("cbsite-details")).scrollIntoView({ block: "center" });
  }

  /* The page's state in its address, beside #component=PATH (or #find=PATH): #rank=N (a sharded run's rank
     selector), #phase=P (the icicle's phase, which the lists and notes under it follow) and #zoom=PATH (the icicle's
     zoomed node), joined by "&" ("#component=over_arch&rank=1&phase=backward"). A link with them opens the page so;
     a change is written with history.replaceState (no scroll, no history entry). Defaults (all ranks, the first
     phase, no zoom) are left out; a plain anchor (#warnings) is not a state (address.js). */
  var address = new window.CbsiteAddress(["component", "find", "rank", "phase", "zoom"]);
  function mountAddress(d, run) {
    var phaseSel = document.getElementById("cbsite-phase"), rankSel = document.getElementById("cbsite-rank");
    var current = function () {
      return { rank: rankSel && rankSel.value !== "all" ? rankSel.value : null,
               phase: phaseSel.value !== d.phases[0] ? phaseSel.value : null,
               zoom: run.icicle.zoom > 0 ? d.path[run.icicle.zoom] : null };
    };
    var choose = window.CbsiteAddress.choose;
    var applying = false;
    var save = function () { if (!applying) address.write(current()); };
    // The rank and phase first (the details panel and the zoom then show them), the component, then the zoom asked
    // for (over the component's parent, which opening a component zooms to).
    var apply = function (first) {
      var h = address.read();
      if (!first && !Object.keys(h).length) return;
      applying = true;
      choose(rankSel, h.rank);
      choose(phaseSel, h.phase);
      openLinked(d);
      var z = "zoom" in h ? d.path.indexOf(h.zoom) : -1;
      if (z >= 0) run.icicle.zoomTo(z);
      applying = false;
      save();
    };
    if (rankSel) rankSel.addEventListener("change", save);
    phaseSel.addEventListener("change", save);
    run.icicle.opts.onZoom = save;
    apply(true);
    window.addEventListener("hashchange", function () { apply(false); });
  }

  R.address = address; R.mountAddress = mountAddress;
})();
