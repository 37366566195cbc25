/* The run page's component table: its columns, and the module types fitted to the room the other columns leave. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};
  var BOUND_HELP = R.BOUND_HELP, metric = R.metric, utilCell = R.utilCell, latencyCell = R.latencyCell,
      boundOf = R.boundOf, fullPath = R.fullPath, status = R.status, text = R.text, span = R.span, hasAny = R.hasAny,
      hasArtifacts = R.hasArtifacts, artifacts = R.artifacts, details = R.details, shardedColumns = R.shardedColumns,
      address = R.address;

  /* Module types in the run table: the class name whole wherever the table has room for it. Where the table is
     wider than the page with every name whole and every row one line, its headers go on two lines (every header
     broken between its words: "fwd / latency"), and the types get what the other columns leave; a name wider than
     that keeps its first and last words and drops whole words from the middle ("Sharded\u2026Collection"), never its
     start or its end. The full dotted name is the cell's title, the class name its (hidden) text. */
  var TYPE_MIN_PX = 90;  // the narrowest the column gets (the old 5rem cut): a narrow window scrolls the table
  function typeInto(td, full, shown) {
    var name = full.split(".").pop();
    td.className = "type"; td.title = full; td.textContent = ""; td.setAttribute("data-name", name);
    if (!shown || shown === name) { td.textContent = name; return; }
    span(td, "cbsite-hidden-text", name);  // first: its static place is the cell's start, never past its end
    span(td, "cbsite-type-short", shown).setAttribute("aria-hidden", "true");
  }
  /* A CamelCase name's words: "FMInteractionArch" is FM, Interaction, Arch; "RwSparseFeaturesDist" four. */
  function camelWords(s) { return s.match(/[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^A-Za-z0-9]+/g) || [s]; }
  /* The longest abbreviation of `name` that `fits`: a run of whole words dropped from the middle, its first and last
     words kept ("Sharded\u2026Collection"), never one another name reads as; where none fits, the shortest of them (a
     narrow window scrolls the table anyway). A name of one or two words keeps its last word whole and as much of its start as fits, 3 letters at
     least ("Fact\u2026Machine"); one word, its start and end. */
  function abbreviate(name, fits, taken) {
    if (fits(name)) return name;
    var w = camelWords(name), best = null, shortest = null, E = "\u2026";
    for (var i = 1; i < w.length - 1; i++) {
      for (var j = i + 1; j <= w.length - 1; j++) {
        var c = w.slice(0, i).join("") + E + w.slice(j).join("");
        if (taken[c]) continue;  // another name already reads so ("Tw\u2026Dist"): this one keeps more
        if ((!best || c.length > best.length) && fits(c)) best = c;
        if (!shortest || c.length < shortest.length) shortest = c;
      }
    }
    if (best || shortest) return best || shortest;
    var last = w.length > 1 ? w[w.length - 1] : "";
    if (last) {
      for (var k = name.length - last.length - 1; k >= 3; k--) {
        c = name.slice(0, k) + E + last;
        if (fits(c)) return c;
      }
      return name.slice(0, 3) + E + last;
    }
    for (k = name.length - 1; k > 6; k--) {
      c = name.slice(0, k - Math.floor(k / 2)) + E + name.slice(name.length - Math.floor(k / 2));
      if (fits(c)) return c;
    }
    return name.slice(0, 3) + E + name.slice(-3);
  }
  var measurer = null;
  function fitTypes(box) {
    var wrap = box.querySelector(".cbsite-table-wrap"), table = wrap && wrap.querySelector("table");
    var cells = table ? Array.prototype.slice.call(table.querySelectorAll("tbody td.type")) : [];
    if (!cells.length) return;
    // Every change before the first read, so that a table whose names all fit whole costs one layout.
    cells.forEach(function (td) { if (td.firstElementChild) typeInto(td, td.title); });  // an abbreviated one
    table.classList.remove("cbsite-tight");
    table.classList.add("cbsite-one-line");
    if (!wrap.clientWidth) return;
    var st = getComputedStyle(cells[0]);
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = st.fontStyle + " " + st.fontWeight + " " + st.fontSize + " " + st.fontFamily;
    var width = function (s) { return measurer.measureText(s).width; };
    var widest = Math.max.apply(null, cells.map(function (td) { return width(td.getAttribute("data-name")); }));
    var over = function () { return table.scrollWidth - wrap.clientWidth; };  // how much wider than the page
    if (over() <= 0) return;  // all whole, each row one line, the headers too
    table.classList.add("cbsite-tight");
    var px = over();
    if (px > 0) {
      var room = Math.max(widest - px - 2, TYPE_MIN_PX), done = {}, taken = {};
      cells.forEach(function (td) {
        var name = td.getAttribute("data-name");
        if (width(name) <= room) return;
        if (!(name in done)) {
          done[name] = abbreviate(name, function (s) { return width(s) <= room; }, taken);
          taken[done[name]] = true;
        }
        typeInto(td, td.title, done[name]);
      });
      px = over();
    }
    // A window too narrow even so: the table as it was (it scrolls; its artifacts break between the groups).
    if (px > 0) { table.classList.remove("cbsite-tight"); table.classList.remove("cbsite-one-line"); }
  }

  /* A path as the run table shows it: its last segment, indented by depth (the cell's padding), the parent part
     kept in the text for find-in-page, the filter and copying, but visually hidden; the full path in the title. */
  function pathInto(el, d, i) {
    if (d.path[i] === "") { span(el, "name", d.model); span(el, "parent", " (root)"); return; }
    var cut = d.path[i].lastIndexOf(".");
    if (cut >= 0) span(el, "parent cbsite-hidden-text", d.path[i].slice(0, cut + 1));
    span(el, "name", d.path[i].slice(cut + 1));
  }

  function pathText(el, path, model) {
    if (path === "") { span(el, "name", model); span(el, "parent", " (root)"); return; }
    var cut = path.lastIndexOf(".");
    if (cut >= 0) {
      var prefix = span(el, "parent", "");
      path.slice(0, cut + 1).split(".").forEach(function (seg, j, all) {
        if (j === all.length - 1) return;
        prefix.appendChild(document.createTextNode(seg + "."));
        prefix.appendChild(document.createElement("wbr"));
      });
    }
    span(el, "name", path.slice(cut + 1));
  }

  /* The table, its first page of rows built `firstRows` a task (all at once without it) and put in together; its module
     types are fitted by `fitTable`, then at each redrawing. */
  function mountTable(root, d, ops, firstRows) {
    var state = { phase: d.phases[0] };
    var panel = document.getElementById("cbsite-details");
    var showDetails = function (i) { details(panel, d, i, ops); };
    var ph = function () { return state.phase; };
    var num = function (key, fmt, label, title, phase) {
      return { key: key + (phase || ""), label: label, title: title, numeric: true,
        value: function (i) { return metric(d, phase || ph(), key, i); },
        cell: function (i, td) { text(td, fmt(metric(d, phase || ph(), key, i))); } };
    };
    var latencyColumn = function (phase, label, title) {
      return { key: "latency_ms" + phase, label: label, title: title, numeric: true,
        value: function (i) { return metric(d, phase, "latency_ms", i); },
        cell: function (i, td) { latencyCell(d, phase, i, td); } };
    };
    var columns = [
      { key: "path", label: "path", value: function (i) { return d.path[i]; },
        cell: function (i, td) {
          td.className = "path";
          td.style.paddingLeft = (0.3 + 0.6 * d.depth[i]) + "em";
          var a = document.createElement("a");
          a.href = "#component=" + encodeURIComponent(d.path[i]); a.title = fullPath(d, i);
          pathInto(a, d, i);
          a.addEventListener("click", function (e) {
            e.preventDefault();
            address.write({ component: d.path[i], find: null });
            showDetails(i);
          });
          td.appendChild(a);
        } },
      { key: "module_type", label: "module type", value: function (i) { return d.module_type[i]; },
        cell: function (i, td) { typeInto(td, d.module_type[i]); } },
      latencyColumn("forward", "fwd latency", "forward latency per forward of the model (median x calls; \u26a0 slower than its parent)"),
      latencyColumn("backward", "bwd latency", "backward latency per forward of the model (median x calls; \u26a0 slower than its parent)"),
      { key: "param_bytes", label: "size", title: "static size: parameters and buffers of the subtree", numeric: true,
        value: function (i) { return d.param_bytes[i]; }, cell: function (i, td) { text(td, F.bytes(d.param_bytes[i])); } },
      num("tflops_per_s", function (v) { return F.isNum(v) ? F.flops(v * 1e12) + "/s" : F.DASH; }, "FLOP/s", "achieved FLOP/s per call (selected phase)"),
      { key: "mfu", label: "MFU", title: "model FLOPs utilisation against the peak in the summary (\u26a0 above 100 %: suspect)", numeric: true,
        value: function (i) { return metric(d, ph(), "mfu", i); }, cell: function (i, td) { utilCell(d, ph(), "mfu", i, td); } },
      num("cpu_time_ms", F.ms, "CPU time", "CPU time per forward of the model"),
      hasAny(d, "device_time_ms") ? num("device_time_ms", F.ms, "GPU time", "device time per forward of the model") : null,
      num("bandwidth_gbps", function (v) { return F.isNum(v) ? F.bytes(v * 1e9) + "/s" : F.DASH; }, "bandwidth", "estimated bandwidth (roofline bytes / latency)"),
      { key: "bandwidth_util", label: "BW util", title: "estimated bandwidth against the peak in the summary (\u26a0 above 100 %: suspect, a cache-resident working set or bytes counted per rank)", numeric: true,
        value: function (i) { return metric(d, ph(), "bandwidth_util", i); }, cell: function (i, td) { utilCell(d, ph(), "bandwidth_util", i, td); } },
      { key: "bound", label: "bound by", title: "what bounds its time: compute, memory bandwidth or overhead (README: Bound by what)",
        value: function (i) { return boundOf(d, ph(), i); },
        cell: function (i, td) {
          var b = boundOf(d, ph(), i);
          if (!b) { td.textContent = F.DASH; return; }
          var s = document.createElement("span");
          // "comm." in the table (the full word would widen the column and wrap every row); lists say it whole.
          s.className = "cbsite-bound bound-" + b; s.textContent = b === "communication" ? "comm." : b;
          s.title = b + ": " + BOUND_HELP[b];
          td.appendChild(s);
        } },
    ].concat(d.sharded ? shardedColumns(d, ph) : []).concat([
      { key: "status", label: "status", value: function (i) { return status(d, ph(), i); },
        cell: function (i, td) {
          var s = status(d, ph(), i);
          var span = document.createElement("span");
          span.className = "cbsite-status status-" + s; span.textContent = s;
          if (s === "failed" && d[ph()].error[i]) span.title = d[ph()].error[i];
          td.appendChild(span);
        } },
      hasArtifacts(d, ops) ? { key: "links", label: "artifacts", cell: function (i, td) {
          td.className = "links";
          artifacts(root, d, i, td, ops && ops.components, showDetails);
        } } : null
    ]).filter(Boolean);  // a column no row has a value for (GPU time on a CPU, artifacts) is left out
    // A sharded run's table would not fit the page with both: its compute metrics by default, the collectives'
    // traffic (bytes sent and received, GB/s, c10d ops) behind the column choice.
    var COMPUTE = ["tflops_per_s", "mfu", "cpu_time_ms", "device_time_ms", "bandwidth_gbps", "bandwidth_util", "bound"];
    if (d.sharded) columns.forEach(function (c) { if (COMPUTE.indexOf(c.key) >= 0) c.group = "compute"; });
    state.group = "compute";
    var t = new window.CbsiteTable(document.getElementById("cbsite-table"), {
      columns: columns, count: d.path.length, pageSize: 100, firstRows: firstRows,
      tableClass: "cbsite-one-line",  // what fitTypes sets first: laid out once where the names fit whole
      onRefresh: function () { if (t && t.fitting) fitTypes(document.getElementById("cbsite-table")); },
      visible: function (c) { return !c.group || c.group === state.group; },
      text: function (i) { return d.path[i] === "" ? d.model : d.path[i]; },
      depth: function (i) { return d.depth[i]; },
      extraControls: function (bar) {
        if (d.phases.length < 2) return;
        var s = document.createElement("select");
        s.className = "cbsite-table-phase";
        s.setAttribute("aria-label", "phase of the per-phase columns");
        d.phases.forEach(function (p) { var o = document.createElement("option"); o.value = p; o.textContent = p + " columns"; s.appendChild(o); });
        s.addEventListener("change", function () { state.phase = s.value; t.refresh(); });
        bar.appendChild(s);
      },
      groupControls: function (bar) {
        if (!d.sharded) return;
        var g = document.createElement("select");
        g.className = "cbsite-table-group";
        g.setAttribute("aria-label", "which columns: compute metrics or the collectives' traffic");
        [["compute", "compute columns"], ["communication", "communication columns (kind, bytes sent, received, GB/s, c10d ops)"]].forEach(function (o) {
          var e = document.createElement("option"); e.value = o[0]; e.textContent = o[1]; g.appendChild(e); });
        g.addEventListener("change", function () { state.group = g.value; t.setVisible(); });
        bar.appendChild(g);
      }
    });
    var resized = null;  // the room for the types follows the window
    window.addEventListener("resize", function () { clearTimeout(resized); resized = setTimeout(function () { fitTypes(document.getElementById("cbsite-table")); }, 100); });
    return t;
  }

  function fitTable(t) {
    t.fitting = true;
    fitTypes(document.getElementById("cbsite-table"));
  }

  R.pathText = pathText; R.mountTable = mountTable; R.fitTable = fitTable;
})();
