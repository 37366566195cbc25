/* A sharded run on the run page: its table columns and tooltip rows (rank, imbalance, collectives' traffic), and the
   rank selector, which swaps every view to one rank's rows, with the notes on rows of different ranks. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};
  var BOUND_HELP = R.BOUND_HELP, KIND_HELP = R.KIND_HELP, metric = R.metric, utilText = R.utilText,
      utilCell = R.utilCell, onRank = R.onRank, rankAbove = R.rankAbove, fullPath = R.fullPath, text = R.text,
      col = R.col, gbps = R.gbps, select = R.select, details = R.details;

  function kindCell(d, phase, i, td) {
    var k = col(d, phase, "kind", i);
    if (!k) { td.textContent = F.DASH; return; }
    var s = document.createElement("span");
    s.className = "cbsite-kind kind-" + k; s.textContent = k; s.title = KIND_HELP[k] || "";
    td.appendChild(s);
  }
  function shardedColumns(d, ph) {
    var v = function (key) { return function (i) { return col(d, ph(), key, i); }; };
    return [
      { key: "kind", group: "communication", label: "kind", title: "compute, or communication (issues collectives)", value: v("kind"),
        cell: function (i, td) { kindCell(d, ph(), i, td); } },
      { key: "rank", label: "rank", title: "the rank whose row this is (in the all-ranks view: the slowest)", numeric: true,
        value: v("rank"), cell: function (i, td) { var r = col(d, ph(), "rank", i); text(td, F.isNum(r) ? String(r) : F.DASH); } },
      { key: "imbalance", label: "imbal\u00adance", title: "slowest rank / mean over the ranks", numeric: true, value: v("imbalance"),
        cell: function (i, td) { var x = col(d, ph(), "imbalance", i); text(td, F.isNum(x) ? F.num(x) + "\u00d7" : F.DASH); } },
      { key: "comm_bytes_sent", group: "communication", label: "sent", title: "bytes this rank hands its collectives, per call", numeric: true,
        value: v("comm_bytes_sent"), cell: function (i, td) { text(td, F.bytes(col(d, ph(), "comm_bytes_sent", i))); } },
      { key: "comm_bytes_received", group: "communication", label: "received", title: "bytes its collectives fill, per call", numeric: true,
        value: v("comm_bytes_received"), cell: function (i, td) { text(td, F.bytes(col(d, ph(), "comm_bytes_received", i))); } },
      { key: "comm_gbps", group: "communication", label: "comm GB/s", title: "collective traffic (sent + received) over the latency", numeric: true,
        value: v("comm_gbps"), cell: function (i, td) { text(td, gbps(col(d, ph(), "comm_gbps", i))); } },
      { key: "collectives", group: "communication", label: "collectives", title: "c10d ops of one call with their counts",
        value: function (i) { return (col(d, ph(), "collectives", i) || []).join(" "); },
        cell: function (i, td) { var c = col(d, ph(), "collectives", i); text(td, c && c.length ? c.join(", ") : F.DASH); } }
    ];
  }
  function shardedTip(d) {
    return function (i, phase) {
      var rows = [["rank", F.isNum(col(d, phase, "rank", i)) ? String(col(d, phase, "rank", i)) : F.DASH],
        ["imbalance", F.isNum(col(d, phase, "imbalance", i)) ? F.num(col(d, phase, "imbalance", i)) + "\u00d7" : F.DASH]];
      if (col(d, phase, "kind", i) === "communication") {
        rows.push(["bytes sent", F.bytes(col(d, phase, "comm_bytes_sent", i))],
          ["bytes received", F.bytes(col(d, phase, "comm_bytes_received", i))],
          ["collective throughput", gbps(col(d, phase, "comm_gbps", i))],
          ["collectives", (col(d, phase, "collectives", i) || []).join(", ") || F.DASH]);
      }
      return rows;
    };
  }
  /* The Totals table (the template's, from the root row) for one rank: the root row of that rank's view, in the
     template's columns and number formats (cbsite/format.py, format.js). */
  function rankTotals(box, d) {
    var r = d.path.indexOf("");
    if (r < 0) return;
    Array.prototype.forEach.call(box.querySelectorAll("tbody tr"), function (tr) {
      var p = tr.children[0].textContent, c = tr.children;
      if (!d[p] || c.length < 11) return;
      var v = function (key) { return col(d, p, key, r); };
      var set = function (k, t) { c[k].className = "num"; c[k].removeAttribute("title"); c[k].textContent = t; };
      set(1, F.ms(metric(d, p, "latency_ms", r)));
      set(2, F.isNum(v("latency_p25_ms")) && F.isNum(v("latency_p75_ms")) ? F.ms(v("latency_p25_ms")) + " \u2013 " + F.ms(v("latency_p75_ms")) : F.DASH);
      set(3, F.flops(metric(d, p, "flops", r)));
      set(4, F.isNum(v("tflops_per_s")) ? F.flops(v("tflops_per_s") * 1e12) + "/s" : F.DASH);
      set(5, ""); utilCell(d, p, "mfu", r, c[5]);
      set(6, F.bytes(v("bytes_moved")));
      set(7, utilText(d, p, "bandwidth_util", r));
      set(8, F.bytes(d.param_bytes[r]));
      set(9, F.bytes(v("peak_memory_bytes")));
      c[10].textContent = v("status") || F.DASH;
    });
  }

  function node(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function boundBadge(parent, b) {
    var s = node("span", "cbsite-bound bound-" + b.replace(/ /g, "-"), parent, b);
    if (BOUND_HELP[b]) s.title = BOUND_HELP[b];
    return s;
  }

  /* "Where the time goes" of one rank (rankdata.py `sharded.facts`: rundata.key_facts of that rank's rows), in the
     template's markup (run.md.j2): per phase the leaves' bound mix and the slowest components. */
  function factsInto(box, facts, d) {
    box.textContent = "";
    d.phases.forEach(function (phase) {
      var rows = facts.slowest[phase];
      if (!rows) return;
      var fact = node("div", "cbsite-fact", box);
      node("h3", "", fact, "Slowest components (" + phase + ")");
      var mix = facts.bounds[phase];
      if (mix && mix.length) {
        var p = node("p", "cbsite-boundmix", fact, "Leaf time" +
          (F.isNum(facts.leaf_share[phase]) ? " (" + F.pct(facts.leaf_share[phase]) + " of " + phase + " latency)" : "") + ": ");
        mix.forEach(function (b, j) {
          boundBadge(p, b.bound);
          p.appendChild(document.createTextNode(" " + F.pct(b.share) + (j < mix.length - 1 ? " \u00b7 " : "")));
        });
      }
      var ol = node("ol", "cbsite-hot", fact);
      rows.forEach(function (c) {
        var li = node("li", c.own ? "cbsite-own" : "", ol);
        var a = node("a", "", li);
        a.href = "#component=" + encodeURIComponent(c.path);
        F.pathInto(node("code", "", a), c.path);
        if (c.own) { li.appendChild(document.createTextNode(" ")); node("strong", "", li, "own time"); }
        li.appendChild(document.createTextNode(" " + F.ms(c.latency) + (F.isNum(c.share) ? " (" + F.pct(c.share) + ")" : "") +
          (c.calls > 1 ? ", " + c.calls + " calls" : "")));
        if (c.bound) { li.appendChild(document.createTextNode(" ")); boundBadge(li, c.bound); }
        li.appendChild(document.createTextNode(" "));
        node("span", "cbsite-type", li, (c.own ? "not in any child \u00b7 " : "") + c.module_type.split(".").pop());
      });
    });
  }

  /* In the all-ranks view a component can show more time than its parent, each row being its own slowest rank:
     the words under the icicle (its phase: the largest such pairs) and under the Totals (components above the whole
     model's row) say so, with each row's rank and the child's time on its parent's rank (within the parent there, or
     above it too: then it is an inversion, as the table's mark says). Hidden in one rank's view. */
  var ABOVE_SHOWN = 3;
  function rankNotes(d) {
    var icicleNote = document.getElementById("cbsite-rank-note"), totalsNote = document.getElementById("cbsite-totals-note");
    var rankSel = document.getElementById("cbsite-rank"), phaseSel = document.getElementById("cbsite-phase");
    var c = function (phase, key, i) { return d[phase][key][i]; };
    var pair = function (phase, a, i, p) {
      return fullPath(d, i) + " " + F.ms(metric(d, phase, "latency_ms", i)) + " on rank " + c(phase, "rank", i) + " " + a + " " +
        fullPath(d, p) + " " + F.ms(metric(d, phase, "latency_ms", p)) + " on rank " + c(phase, "rank", p);
    };
    var more = function (n) { return n > ABOVE_SHOWN ? "; and " + (n - ABOVE_SHOWN) + " more" : ""; };
    var onParentRank = function (phase, e) {
      var rank = c(phase, "rank", e.parent), there = onRank(d, phase, e.child, rank);
      if (!F.isNum(there)) return "";
      return " (on rank " + rank + " " + F.ms(there) + ", " + (there > metric(d, phase, "latency_ms", e.parent) ?
        "above it there too: timed alone it pays a cost the parent amortises, or a disturbance" : "within it") + ")";
    };
    return function () {
      var all = !rankSel || rankSel.value === "all";
      if (icicleNote) {
        var phase = phaseSel.value, found = [];
        for (var i = 0; all && d[phase] && i < d.path.length; i++) { var e = rankAbove(d, phase, i); if (e) found.push(e); }
        found.sort(function (x, y) { return y.excess - x.excess || x.child - y.child; });
        icicleNote.hidden = !found.length;
        icicleNote.textContent = found.length ? "In the all-ranks view each row is its own slowest rank, and a component can show " +
          "more time than its parent (" + phase + "): " + found.slice(0, ABOVE_SHOWN).map(function (e) {
            return pair(phase, "under", e.child, e.parent) + onParentRank(phase, e); }).join("; ") + more(found.length) +
          ". Choose a rank to see one rank's rows." : "";
      }
      if (totalsNote) {
        var root = d.path.indexOf(""), lines = [];
        d.phases.forEach(function (ph) {
          if (!all || root < 0 || !F.isNum(c(ph, "rank", root))) return;
          var whole = metric(d, ph, "latency_ms", root), above = [];
          for (var j = 0; j < d.path.length; j++) {
            if (j !== root && F.isNum(c(ph, "rank", j)) && c(ph, "rank", j) !== c(ph, "rank", root) &&
                metric(d, ph, "latency_ms", j) > whole) above.push(j);
          }
          above.sort(function (x, y) { return metric(d, ph, "latency_ms", y) - metric(d, ph, "latency_ms", x) || x - y; });
          if (above.length) lines.push(ph + ": " + above.slice(0, ABOVE_SHOWN).map(function (j) {
            return fullPath(d, j) + " " + F.ms(metric(d, ph, "latency_ms", j)) + " on rank " + c(ph, "rank", j); }).join(", ") +
            more(above.length) + " above the whole model's " + F.ms(whole) + " on rank " + c(ph, "rank", root));
        });
        totalsNote.hidden = !lines.length;
        totalsNote.textContent = lines.length ? "These totals are the whole model's slowest rank and each component's row its own " +
          "slowest rank; some show more time than the whole model: " + lines.join("; ") + "." : "";
      }
    };
  }

  /* The rank selector: the all-ranks view (each component's slowest rank, components.parquet) or one rank's
     rows (ranks.parquet); it swaps the per-phase columns the icicle, the table, the Totals (the root's row) and
     the details panel read, and "Where the time goes" (that rank's lists, rankdata.py), then redraws them. */
  function mountRanks(d, run) {
    var s = document.getElementById("cbsite-rank");
    if (!s) return;
    var totals = document.getElementById("cbsite-totals"), allTotals = totals ? totals.innerHTML : "";
    var facts = document.querySelector("#cbsite-run .cbsite-facts"), allFacts = facts ? facts.innerHTML : "";
    var keyTotals = Array.prototype.map.call(document.querySelectorAll("#cbsite-run .cbsite-keytotal"), function (e) { return [e, e.textContent]; });
    var notes = rankNotes(d);
    var note = document.getElementById("cbsite-totals-rank"), panel = document.getElementById("cbsite-details");
    var base = {};
    d.phases.forEach(function (p) { base[p] = {}; Object.keys(d[p]).forEach(function (k) { base[p][k] = d[p][k]; }); });
    var options = { all: "all ranks (slowest)" };
    d.sharded.ranks.forEach(function (r) { options[r] = "rank " + r; });
    var rankSelect = select("cbsite-rank", options, "all", function (value) {
      d.phases.forEach(function (p) {
        Object.keys(base[p]).forEach(function (k) { d[p][k] = base[p][k]; });
        var view = value === "all" ? null : (d.sharded.views[value] || {})[p];
        if (view) Object.keys(view).forEach(function (k) { d[p][k] = view[k]; });
      });
      run.icicle.render();
      run.table.refresh();
      if (totals) { totals.innerHTML = allTotals; if (value !== "all") rankTotals(totals, d); }
      if (facts) { if (value === "all") facts.innerHTML = allFacts; else factsInto(facts, d.sharded.facts[value], d); }
      keyTotals.forEach(function (e) {  // the key facts line's latency per phase: the whole model's, on this rank
        var root = d.path.indexOf("");
        e[0].textContent = value === "all" || root < 0 ? e[1] : F.ms(metric(d, e[0].getAttribute("data-phase"), "latency_ms", root));
      });
      notes();
      if (note) note.textContent = value === "all" ? "" : " \u00b7 rank " + value;
      if (panel && !panel.hidden && panel.hasAttribute("data-index")) details(panel, d, +panel.getAttribute("data-index"), run.ops, true);
      document.getElementById("cbsite-run").setAttribute("data-rank", value);
    });
    // "all ranks" first: an object lists integer-like keys ("0", "1") before the others.
    rankSelect.insertBefore(rankSelect.querySelector("option[value='all']"), rankSelect.firstChild);
    document.getElementById("cbsite-phase").addEventListener("change", notes);
    notes();
  }

  R.shardedColumns = shardedColumns; R.shardedTip = shardedTip; R.mountRanks = mountRanks;
})();
