/* The run page: loads components.json once and drives the icicle, the table and the details panel. Its parts are
   loaded before it: rundata.js (the columns as the page reads them), rundetails.js, runicicle.js, runranks.js (a
   sharded run's ranks), runlinks.js (the address) and runtable.js; they share window.CbsiteRunPage. */
(function () {
  "use strict";
  var R = window.CbsiteRunPage;
  var ROWS_PER_TASK = 25;  // more than a screen of the table

  /* `fn` in a task after the next frame is painted. */
  function afterPaint(fn) {
    requestAnimationFrame(function () { setTimeout(fn, 0); });
  }

  function start() {
    var root = document.getElementById("cbsite-run");
    if (!root) return;
    var opsUrl = root.getAttribute("data-ops");
    Promise.all([R.fetchJson(root.getAttribute("data-components")), opsUrl ? R.fetchJson(opsUrl) : Promise.resolve(null)])
      .then(function (res) {
        var d = res[0];
        if (!d.phases.length) { root.querySelector(".cbsite-loading").textContent = "This run has no rows."; return; }
        root.querySelector(".cbsite-loading").hidden = true;
        var kindColour = d.sharded ? { kind: { extra: true, label: "kind", kind: "category", categories: R.KIND, fmt: String,
          value: function (i, phase) { return R.col(d, phase, "kind", i); } } } : null;
        var run = window.cbsiteRun = { data: d, icicle: R.mountIcicle(d, "cbsite", kindColour, d.sharded ? "kind" : null,
          d.sharded ? R.shardedTip(d) : null), table: null, ops: res[1] };
        // The icicle answers the first screen: it is painted first, then the table below it is built, its rows a few
        // in each task and put in the page together (one layout), and its module types are fitted (a layout) once the
        // browser has laid them out. An address that names a component or a view (or a search result's query) is
        // applied at once, so that the icicle is first shown as it asks.
        var rest = function () {
          R.fitTable(run.table);
          if (d.sharded) R.mountRanks(d, run);
          R.mountAddress(d, run);
          root.setAttribute("data-ready", "1");
        };
        if (Object.keys(R.address.read()).length || /[?&](find|h)=/.test(location.search)) {
          run.table = R.mountTable(root, d, res[1]);
          rest();
        } else {
          afterPaint(function () {
            run.table = R.mountTable(root, d, res[1], ROWS_PER_TASK);
            run.table.whenDrawn(function () { afterPaint(rest); });
          });
        }
      })
      .catch(function (err) {
        root.querySelector(".cbsite-loading").textContent = "Could not load the run data (" + err.message +
          "). Serve the site over HTTP (cbsite serve) rather than opening the files directly.";
      });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
