/* The run page's details panel (a component's every column, per phase, and its op breakdown) and each table row's
   artifact links (traces, Perfetto, memory timelines, logs). */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};
  var link = R.link, fullPath = R.fullPath, utilText = R.utilText, utilCell = R.utilCell,
      slowerThanParent = R.slowerThanParent;

  /* The site's one memory viewer, given the timeline's path on this site. */
  function memoryView(root, file) {
    return root.getAttribute("data-memory-viewer") + "?data=" + encodeURIComponent(new URL(file, location.href).pathname);
  }

  function perfettoButton(root, d, i, phase, file) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "cbsite-perfetto";
    b.textContent = "Perfetto";
    b.title = "Open the " + phase + " trace of " + fullPath(d, i) + " in the Perfetto UI at " +
      root.getAttribute("data-perfetto-origin") + " (it must be reachable from this browser)";
    b.setAttribute("data-trace", file);
    b.addEventListener("click", function () {
      window.CbsitePerfetto.open(root.getAttribute("data-perfetto-origin"), file,
        d.model + " " + d.version + " " + fullPath(d, i) + " (" + phase + ")");
    });
    return b;
  }

  /* Artifact links of component i on one line: per phase its tag ("fwd", "bwd") then the trace, the trace in the
     Perfetto UI and the memory timeline, then the log and the op breakdown. Short words, each with a title and an
     accessible name that say what it is, of which phase and component (the row keeps one text line high). */
  function artLink(href, text, what) {
    var a = link(href, text);
    a.title = what; a.setAttribute("aria-label", what);
    return a;
  }
  function artifacts(root, d, i, td, opsComponents, onOps) {
    var log = null, who = fullPath(d, i);
    (d.phases || []).forEach(function (phase) {
      var c = d[phase], short = phase === "forward" ? "fwd" : "bwd";
      log = log || c.log_file[i];
      if (!c.trace_file[i] && !c.memory_file[i]) return;
      var group = document.createElement("span");
      group.className = "cbsite-art";
      group.setAttribute("role", "group");
      group.setAttribute("aria-label", phase + " artifacts of " + who);
      var tag = document.createElement("span");
      tag.className = "cbsite-art-phase"; tag.textContent = short; tag.title = phase;
      group.appendChild(tag);
      if (c.trace_file[i]) {
        group.appendChild(artLink(c.trace_file[i], "trace", "the " + phase + " trace of " + who + " (gzipped Chrome trace JSON)"));
        var p = perfettoButton(root, d, i, phase, c.trace_file[i]);
        p.setAttribute("aria-label", "open the " + phase + " trace of " + who + " in the Perfetto UI");
        group.appendChild(p);
      }
      if (c.memory_file[i]) group.appendChild(artLink(memoryView(root, c.memory_file[i]), "mem", "the " + phase + " memory timeline of " + who));
      td.appendChild(group);
    });
    var rest = document.createElement("span");
    rest.className = "cbsite-art";
    if (log) rest.appendChild(artLink(log, "log", "what " + who + " printed or warned while measured (and its traceback if it failed)"));
    if (opsComponents && opsComponents[d.path[i]]) {
      var b = document.createElement("button");
      b.type = "button"; b.className = "cbsite-ops"; b.textContent = "ops";
      b.title = "the op breakdown of " + who + " (opens its details below the table)";
      b.setAttribute("aria-label", b.title);
      b.addEventListener("click", function () { onOps(i); });
      rest.appendChild(b);
    }
    if (rest.childNodes.length) td.appendChild(rest);
  }

  function details(panel, d, i, ops, stay) {
    panel.hidden = false;
    panel.textContent = "";
    panel.setAttribute("data-index", i);
    var h = document.createElement("h3");
    h.textContent = fullPath(d, i);
    panel.appendChild(h);
    var p = document.createElement("p");
    p.textContent = d.module_type[i] + " \u00b7 depth " + d.depth[i] + " \u00b7 " + d.call_count[i] +
      " call(s) per forward \u00b7 " + F.bytes(d.param_bytes[i]) + " of parameters (" + F.num(d.param_count[i]) + ")";
    // The component across the model's versions (the table names the history page; kept out of the table's path
    // cells, which must stay one line).
    var history = document.getElementById("cbsite-table");
    var base = history && history.getAttribute("data-history");
    if (base) {
      var a = document.createElement("a");
      a.className = "cbsite-history-link";
      a.href = base + "#component=" + encodeURIComponent(d.path[i]);
      a.textContent = "history across versions";
      a.title = "this component's latency, FLOPs and memory in every version of the model";
      p.appendChild(document.createTextNode(" \u00b7 "));
      p.appendChild(a);
    }
    panel.appendChild(p);
    var t = document.createElement("table");
    t.className = "cbsite-details";
    var rows = [["rank", "rank", String], ["status", "status", String], ["error", "error", String],
      ["latency (median, per call)", "latency_ms", F.ms], ["latency p25", "latency_p25_ms", F.ms],
      ["latency p75", "latency_p75_ms", F.ms], ["samples", "samples", F.num], ["CPU time", "cpu_time_ms", F.ms],
      ["GPU time", "device_time_ms", F.ms], ["FLOPs per call", "flops", F.flops], ["TFLOP/s", "tflops_per_s", F.num],
      ["MFU", "mfu", "util"], ["bytes moved (estimate)", "bytes_moved", F.bytes], ["bandwidth GB/s", "bandwidth_gbps", F.num],
      ["bandwidth utilisation", "bandwidth_util", "util"], ["arithmetic intensity", "arithmetic_intensity", F.num],
      ["peak memory", "peak_memory_bytes", F.bytes], ["ops without a FLOP formula", "unsupported_ops", null],
      ["notes", "notes", null], ["input shapes", "input_shapes", String]];
    // Plugin columns the run has (compile, numerics, plugin metrics), by their schema names.
    (d.optional || []).forEach(function (c) { rows.push([c.replace(/_/g, " "), c, typeof d[d.phases[0]][c][0] === "number" ? F.num : String]); });
    var head = document.createElement("tr");
    ["", ].concat(d.phases).forEach(function (ph) { var th = document.createElement("th"); th.textContent = ph; head.appendChild(th); });
    t.appendChild(head);
    rows.forEach(function (r) {
      var any = d.phases.some(function (ph) {
        var v = d[ph][r[1]] ? d[ph][r[1]][i] : null;
        if (r[2] === "util" && utilText(d, ph, r[1], i) === F.NA) return true;  // n/a is an answer
        return v !== null && v !== undefined && !(Array.isArray(v) && !v.length); });
      if (!any) return;
      var tr = document.createElement("tr");
      var th = document.createElement("th"); th.textContent = r[0]; tr.appendChild(th);
      d.phases.forEach(function (ph) {
        var v = d[ph][r[1]] ? d[ph][r[1]][i] : null, td = document.createElement("td");
        if (r[2] === "util") { utilCell(d, ph, r[1], i, td); tr.appendChild(td); return; }
        var fmt = r[2] || String;
        if (typeof v === "number" && fmt === String) fmt = F.num;
        td.textContent = v === null || v === undefined ? F.DASH : Array.isArray(v) ? (v.join("; ") || F.DASH) : fmt(v);
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    panel.appendChild(t);
    d.phases.forEach(function (ph) {
      var why = slowerThanParent(d, ph, i);
      if (!why) return;
      var w = document.createElement("p");
      w.className = "cbsite-warn cbsite-inverted-note";
      w.textContent = "\u26a0 " + ph + ": " + why + ".";
      panel.appendChild(w);
    });
    if (ops && ops.components[d.path[i]]) {
      d.phases.forEach(function (ph) {
        var list = ops.components[d.path[i]][ph];
        if (!list) return;
        var cap = document.createElement("h4");
        cap.textContent = "Op breakdown (" + ph + ")";
        panel.appendChild(cap);
        var ot = document.createElement("table");
        ot.className = "cbsite-details";
        var hr = document.createElement("tr");
        ops.columns.forEach(function (c) { var th = document.createElement("th"); th.textContent = c; hr.appendChild(th); });
        ot.appendChild(hr);
        list.forEach(function (row) {
          var tr = document.createElement("tr");
          row.forEach(function (v) { var td = document.createElement("td"); td.textContent = typeof v === "number" ? F.num(v) : (v === null ? F.DASH : String(v)); tr.appendChild(td); });
          ot.appendChild(tr);
        });
        panel.appendChild(ot);
      });
    }
    if (!stay) panel.scrollIntoView({ block: "nearest" });
  }

  R.artifacts = artifacts; R.details = details;
})();
