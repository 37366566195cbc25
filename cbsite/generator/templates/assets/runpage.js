/* The run page: loads components.json once and drives the icicle, the table and the details panel. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;

  /* `phased`: the name in a phase, which it names ("backward latency per forward of the model"), never the bare
     "latency per forward" that reads as the forward's in the backward phase (phaseLabel). */
  var WIDTH = {
    latency_ms: { label: "latency per forward", phased: "%s latency per forward of the model", fmt: F.ms },
    flops: { label: "FLOPs per forward", phased: "%s FLOPs per forward of the model", fmt: F.flops },
    param_bytes: { label: "parameter bytes", fmt: F.bytes },
    peak_memory_bytes: { label: "peak memory", phased: "%s peak memory", fmt: F.bytes }
  };
  function phaseLabel(spec, phase) { return spec.phased && phase ? spec.phased.replace("%s", phase) : spec.label; }
  /* What bounds a component (cbsite/bound.py); the same colours as the roofline (charts.py BOUND_COLOURS). A sharded
     run's communicating components are "communication" (KIND's colour), never a roofline bound. */
  var BOUND = { compute: "#1f6fb4", memory: "#d9730d", overhead: "#7f7f7f", suspect: "#7b3294", communication: "#c2185b" };
  var BOUND_HELP = { compute: "MFU at least the bandwidth utilisation: at or above the ridge",
    memory: "bandwidth utilisation above MFU: below the ridge, bound by the (estimated) bytes moved",
    overhead: "the roofline explains under 10 % of the time (or the device idles over half of it): launches, dispatch, Python",
    suspect: "MFU or bandwidth utilisation above 100 %: a number beyond its peak is not believed (see the run's warnings)",
    communication: "issues collectives (itself or in its subtree): part of its time waits for the other ranks, which no roofline describes" };
  /* MFU and bandwidth utilisation on absolute 0-100 % scales, each with its own ramp, never scaled to the
     largest value shown: 21 % bandwidth is pale whatever else the drawing holds. */
  var COLOUR = {
    bound: { label: "bound by", kind: "category", categories: BOUND },
    mfu: { label: "MFU", fmt: F.pct, kind: "unit", ramp: "green" },
    bandwidth_util: { label: "bandwidth utilisation", fmt: F.pct, kind: "unit", ramp: "purple" },
    latency_ms: { label: "latency per forward", phased: WIDTH.latency_ms.phased, fmt: F.ms, kind: "log", ramp: "green" },
    flops: { label: "FLOPs per forward", phased: WIDTH.flops.phased, fmt: F.flops, kind: "log", ramp: "green" }
  };
  /* The bound colouring of a run: "communication" is a category of sharded runs only. */
  function boundColouring(d) {
    if (d.sharded) return COLOUR.bound;
    var cats = {};
    Object.keys(BOUND).forEach(function (b) { if (b !== "communication") cats[b] = BOUND[b]; });
    return { label: COLOUR.bound.label, kind: "category", categories: cats };
  }

  function calls(d, i) { return Math.max(d.call_count[i] || 0, 1); }

  /* A metric as the icicle and the table show it: per forward of the whole model for per-call
     metrics (value x calls), static or peak values as they are. */
  function metric(d, phase, key, i) {
    if (key === "param_bytes") return d.param_bytes[i];
    var cols = d[phase];
    if (!cols) return null;
    var v = cols[key][i];
    if (v === null || v === undefined) return null;
    if (key === "latency_ms" || key === "flops" || key === "cpu_time_ms" || key === "device_time_ms") return v * calls(d, i);
    return v;
  }

  /* MFU and bandwidth utilisation as text: n/a where FLOPs (bytes) are zero by definition, and MFU
     above 100 % marked as suspect, never shown as the best value (the run's warnings say why). */
  var SUSPECT = "MFU above 100 %: suspect (timing noise, or a peak this run could not confirm); see the warnings under the run's summary";
  /* Bandwidth above its peak: the bytes are an estimate (every op's inputs and outputs, no cache), so a
     cache-resident working set, or bytes counted once per rank, read as more than the device can move. */
  var SUSPECT_BW = "bandwidth utilisation above 100 %: suspect (bytes served from a cache, or counted once per rank, " +
    "are estimated as moved through memory); see the warnings under the run's summary";
  var SUSPECT_OF = { mfu: SUSPECT, bandwidth_util: SUSPECT_BW };
  var NUMERATOR = { mfu: "flops", tflops_per_s: "flops", bandwidth_util: "bytes_moved", bandwidth_gbps: "bytes_moved" };
  function utilText(d, phase, key, i) {
    return F.util(metric(d, phase, key, i), metric(d, phase, NUMERATOR[key], i), key in SUSPECT_OF);
  }
  function utilCell(d, phase, key, i, td) {
    var v = metric(d, phase, key, i);
    td.textContent = utilText(d, phase, key, i);
    if (key in SUSPECT_OF && F.suspect(v)) { td.classList.add("cbsite-suspect"); td.title = SUSPECT_OF[key]; }
  }

  /* A child slower than its parent beyond both intervals: the collector's rule (cbsite/collector/hierarchy.py,
     README "Consistent hierarchies": the child's p25 above the parent's p75, a median where a quartile is missing,
     equal calls per forward), so the page marks the pairs run.json's `hierarchy` counts as inverted. In the view
     shown: one rank's, or a sharded run's all-ranks view, where each row is its own slowest rank (a pair whose
     slowest ranks differ can be marked there only; rankWords says what the parent's rank makes of it). null, or the
     words that say so. */
  function slowerThanParent(d, phase, i) {
    var p = d.parent[i], c = d[phase];
    if (p < 0 || !c || calls(d, i) !== calls(d, p)) return null;
    var mine = metric(d, phase, "latency_ms", i), theirs = metric(d, phase, "latency_ms", p);
    if (!F.isNum(mine) || !F.isNum(theirs)) return null;
    var quartile = function (key, j) { return c[key] && F.isNum(c[key][j]) ? c[key][j] * calls(d, j) : null; };
    var lo = quartile("latency_p25_ms", i), hi = quartile("latency_p75_ms", p);
    if (!((lo !== null ? lo : mine) > (hi !== null ? hi : theirs))) return null;
    var ranks = rankWords(d, phase, i);
    var beyond = lo !== null && hi !== null ? " (its p25 " + F.ms(lo) + " above the parent's p75 " + F.ms(hi) + ")" : "";
    return "slower than its parent " + fullPath(d, p) + ": " + F.ms(mine) + " vs " + F.ms(theirs) + beyond + ranks +
      ": timed alone it pays a cost the parent amortises, or a disturbance";
  }
  /* A sharded run's component i on the rank of its parent's row (the page's per-rank views, rankdata.py): its
     latency per forward there, or null. */
  function onRank(d, phase, i, rank) {
    var v = d.sharded && d.sharded.views[String(rank)], c = v && v[phase];
    return c && F.isNum(c.latency_ms[i]) ? c.latency_ms[i] * calls(d, i) : null;
  }
  /* Which ranks a child's and its parent's rows come from, in words: "" for a run without ranks, " (rank r)" where
     they share one; where they differ (the all-ranks view: each row its own slowest rank) the ranks and the child on
     its parent's rank, within the parent there (the two rows are only different ranks' times) or above it there too. */
  function rankWords(d, phase, i) {
    var p = d.parent[i], c = d[phase];
    if (p < 0 || !c || !c.rank || !F.isNum(c.rank[i])) return "";
    if (!F.isNum(c.rank[p]) || c.rank[i] === c.rank[p]) return " (rank " + c.rank[i] + ")";
    var there = onRank(d, phase, i, c.rank[p]), theirs = metric(d, phase, "latency_ms", p);
    var then = !F.isNum(there) ? "" : "; on rank " + c.rank[p] + " it takes " + F.ms(there) +
      (F.isNum(theirs) && there > theirs ? ", above its parent there too" : ", within its parent");
    return " (this row rank " + c.rank[i] + ", the parent's rank " + c.rank[p] + ": in the all-ranks view each row is its own slowest rank" + then + ")";
  }
  /* In a sharded run's all-ranks view, a component whose time per forward is above its parent's where the two rows
     come from different ranks: {child, parent, excess (ms)}; else null (rankNotes lists them in words). */
  function rankAbove(d, phase, i) {
    var p = d.parent[i], c = d[phase];
    if (p < 0 || !c || !c.rank || !F.isNum(c.rank[i]) || !F.isNum(c.rank[p]) || c.rank[i] === c.rank[p]) return null;
    var mine = metric(d, phase, "latency_ms", i), theirs = metric(d, phase, "latency_ms", p);
    return F.isNum(mine) && F.isNum(theirs) && mine > theirs ? { child: i, parent: p, excess: mine - theirs } : null;
  }
  function latencyCell(d, phase, i, td) {
    td.textContent = F.ms(metric(d, phase, "latency_ms", i));
    var why = slowerThanParent(d, phase, i);
    if (!why) return;
    td.classList.add("cbsite-suspect", "cbsite-inverted");
    td.title = why;
    var flag = document.createElement("span");
    flag.className = "cbsite-flag"; flag.textContent = " \u26a0"; flag.setAttribute("aria-label", why);
    td.appendChild(flag);
  }

  function boundOf(d, phase, i) { return d[phase] && d[phase].bound ? d[phase].bound[i] : null; }
  function label(d, i) { return d.path[i] === "" ? d.model : d.name[i]; }
  function fullPath(d, i) { return d.path[i] === "" ? d.model + " (root)" : d.path[i]; }
  function status(d, phase, i) { return d[phase] ? (d[phase].status[i] || "absent") : "absent"; }

  function link(href, text, cls) {
    var a = document.createElement("a");
    a.href = href; a.textContent = text;
    if (cls) a.className = cls;
    return a;
  }

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

  function text(td, s, title) { td.textContent = s; if (title) td.title = title; }

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
    if (!cells.length || !wrap.clientWidth) return;
    cells.forEach(function (td) { typeInto(td, td.title); });
    var st = getComputedStyle(cells[0]);
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = st.fontStyle + " " + st.fontWeight + " " + st.fontSize + " " + st.fontFamily;
    var width = function (s) { return measurer.measureText(s).width; };
    var widest = Math.max.apply(null, cells.map(function (td) { return width(td.getAttribute("data-name")); }));
    var over = function () { return table.scrollWidth - wrap.clientWidth; };  // how much wider than the page
    table.classList.remove("cbsite-tight");
    table.classList.add("cbsite-one-line");
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

  function select(id, options, value, onChange) {
    var s = document.getElementById(id);
    s.textContent = "";
    Object.keys(options).forEach(function (k) {
      var o = document.createElement("option");
      o.value = k; o.textContent = options[k].label || options[k];
      s.appendChild(o);
    });
    s.value = value;
    s.addEventListener("change", function () { onChange(s.value); });
    return s;
  }

  function tooltip(d, phase, widthKey, colourKey, colourSpec, extraTip) {
    return function (i, info) {
      var rows = [["", fullPath(d, i)], ["type", d.module_type[i]], ["status", status(d, phase, i)],
        ["calls per forward", String(d.call_count[i])],
        [phaseLabel(WIDTH.latency_ms, phase), F.ms(metric(d, phase, "latency_ms", i))],
        [phaseLabel(WIDTH.flops, phase), F.flops(metric(d, phase, "flops", i))],
        ["parameters", F.bytes(d.param_bytes[i])],
        [phaseLabel(WIDTH.peak_memory_bytes, phase), F.bytes(metric(d, phase, "peak_memory_bytes", i))],
        ["MFU", utilText(d, phase, "mfu", i)],
        ["bandwidth utilisation", utilText(d, phase, "bandwidth_util", i)],
        ["bound by", boundOf(d, phase, i) || F.DASH]];
      Object.keys(SUSPECT_OF).forEach(function (k) { if (F.suspect(metric(d, phase, k, i))) rows.push(["", SUSPECT_OF[k], "warn"]); });
      var slower = slowerThanParent(d, phase, i);
      if (slower) rows.push(["", "\u26a0 " + slower, "warn"]);
      if (colourSpec && colourSpec.extra) rows.push([colourSpec.label, colourSpec.fmt(colourSpec.value(i))]);
      if (extraTip) rows = rows.concat(extraTip(i, phase));
      if (info.share !== null && info.share !== undefined) rows.push(["share of parent", F.pct(info.share)]);
      if (info.self !== null && info.self !== undefined) rows.push(["self share", F.pct(info.self)]);
      if (info.overflow) rows.push(["", "children sum to " + (isFinite(info.overflow) ? info.overflow.toPrecision(3) + "\u00d7" : "more than") +
        " this node's " + phaseLabel(WIDTH[widthKey], phase) + " (replay noise, or a metric that does not add up): scaled to fit", "warn"]);
      var st = status(d, phase, i);
      if (st === "estimated") rows.push(["", "estimated: the sum of its children", "warn"]);
      if (st === "failed") rows.push(["", "failed: " + (d[phase].error[i] || "no error recorded"), "warn"]);
      return rows;
    };
  }

  function span(parent, cls, text, title) {
    var e = document.createElement("span");
    if (cls) e.className = cls;
    if (text) e.textContent = text;
    if (title) e.title = title;
    parent.appendChild(e);
    return e;
  }

  /* The legend: a swatch of the colour scale with its ends (or one swatch per category), then what the
     width, outlines, hatching and grey mean. */
  function drawLegend(box, sc, c, widthLabel, key, phase) {
    box.textContent = "";
    var scaleItem = span(box, "cbsite-legend-item");
    span(scaleItem, "", "colour: " + phaseLabel(c, phase) + " ");
    if (sc.kind === "category") {
      Object.keys(sc.categories).forEach(function (name) {
        var it = span(scaleItem, "cbsite-legend-" + name, "", BOUND_HELP[name] || KIND_HELP[name] || "");
        span(it, "cbsite-swatch", "").style.background = sc.categories[name];
        span(it, "", name + " ");
      });
    } else if (sc.lo === null) {
      span(scaleItem, "", "(no values)");
    } else {
      span(scaleItem, "", c.fmt(sc.lo));
      var stops = (sc.stops || []).map(function (col, j, all) { return col + " " + Math.round(100 * j / (all.length - 1)) + "%"; });
      span(scaleItem, "cbsite-ramp", "").style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
      span(scaleItem, "", c.fmt(sc.hi) + (sc.kind === "unit" ? " (absolute)" : sc.kind === "log" ? " (log)" : ""));
    }
    span(box, "cbsite-legend-item", "width: " + widthLabel);
    var marks = [["hatched", "hatched: estimated, failed or self share"], ["estimated", "dashed outline, \u2248: estimated (sum of children)"],
      ["failed", "red outline, \u2715: failed"], ["overflow", "black and white outline: children add up to more than the node (scaled to fit)"]];
    marks.forEach(function (m) { var it = span(box, "cbsite-legend-item"); span(it, "cbsite-swatch " + m[0], ""); span(it, "", m[1]); });
    var none = span(box, "cbsite-legend-item");
    span(none, "cbsite-swatch", "").style.background = sc.none || window.CbsiteIcicle.fills().none;
    span(none, "", "no value" + (key === "mfu" ? " or MFU above 100 % (suspect: see the run's warnings)" :
      key === "bandwidth_util" ? " or above 100 % (suspect: see the run's warnings)" :
      key === "bound" ? " (no FLOPs and no bytes)" : ""));
    if (c.legend) span(box, "cbsite-legend-item", c.legend);
  }

  /* Mount an icicle with its phase/width/colour controls; `extraColours` adds colour metrics (diff deltas),
     `extraTip(i, phase)` rows to each node's tooltip. */
  function mountIcicle(d, prefix, extraColours, defaultColour, extraTip) {
    var box = document.getElementById(prefix + "-icicle");
    var colours = {};
    Object.keys(extraColours || {}).forEach(function (k) { colours[k] = extraColours[k]; });
    Object.keys(COLOUR).forEach(function (k) { colours[k] = k === "bound" ? boundColouring(d) : COLOUR[k]; });
    var state = { phase: d.phases[0], width: "latency_ms", colour: defaultColour || "mfu" };
    var legend = document.getElementById(prefix + "-legend");
    var crumb = document.getElementById(prefix + "-zoom");
    function colourFn() {
      var c = colours[state.colour];
      if (c.extra) return function (i) { return c.value(i, state.phase); };
      if (state.colour === "bound") return function (i) { return boundOf(d, state.phase, i); };
      if (state.colour in SUSPECT_OF) return function (i) {
        var v = metric(d, state.phase, state.colour, i);
        return F.suspect(v) || metric(d, state.phase, NUMERATOR[state.colour], i) === 0 ? null : v; };
      return function (i) { return metric(d, state.phase, state.colour, i); };
    }
    function opts() {
      var c = colours[state.colour];
      var spec = c.extra ? { extra: true, label: c.label, fmt: c.fmt, value: function (i) { return c.value(i, state.phase); } } : null;
      return {
        parent: d.parent,
        label: function (i) { return label(d, i); },
        status: function (i) { return status(d, state.phase, i); },
        width: function (i) { return metric(d, state.phase, state.width, i); },
        colour: colourFn(), colourKind: c.kind, ramp: c.ramp, categories: c.categories,
        tooltip: tooltip(d, state.phase, state.width, state.colour, spec, extraTip)
      };
    }
    var ic = new window.CbsiteIcicle.Icicle(box, opts());
    var o = ic.opts;
    o.onRender = function (icicle) {
      drawLegend(legend, icicle.scale, colours[state.colour], phaseLabel(WIDTH[state.width], state.phase), state.colour, state.phase);
      crumb.textContent = icicle.zoom === 0 ? "" : "zoomed into " + fullPath(d, icicle.zoom) + " \u2014 click the top bars or the node to back out";
    };
    ic.render();
    var phases = {};
    d.phases.forEach(function (p) { phases[p] = p; });
    // The width and colour choices name the phase's quantity ("backward latency per forward of the model").
    var relabel = function () {
      [[prefix + "-width", WIDTH], [prefix + "-colour", colours]].forEach(function (e) {
        Array.prototype.forEach.call(document.getElementById(e[0]).options, function (o) {
          if (e[1][o.value]) o.textContent = phaseLabel(e[1][o.value], state.phase); });
      });
    };
    select(prefix + "-phase", phases, state.phase, function (v) { state.phase = v; relabel(); ic.setOptions(opts()); });
    select(prefix + "-width", WIDTH, state.width, function (v) { state.width = v; ic.setOptions(opts()); });
    select(prefix + "-colour", colours, state.colour, function (v) { state.colour = v; ic.setOptions(opts()); });
    relabel();
    document.getElementById(prefix + "-reset").addEventListener("click", function () { ic.zoomTo(0); });
    return ic;
  }

  function hasAny(d, key) {
    return d.phases.some(function (p) { return (d[p][key] || []).some(function (v) { return v !== null && v !== undefined; }); });
  }
  function hasArtifacts(d, ops) {
    return !!ops || ["trace_file", "memory_file", "log_file"].some(function (k) { return hasAny(d, k); });
  }

  /* Sharded runs (torchrun): compute and communication apart, the rank each row comes from, its imbalance and
     its collectives' traffic. The colours also serve the icicle's "kind" colouring and its legend. */
  var KIND = { compute: "#1f6fb4", communication: "#c2185b" };
  var KIND_HELP = { compute: "issues no collective", communication: "issues collectives (c10d ops): all-to-all, reduce-scatter, ..." };
  function col(d, phase, key, i) { var c = d[phase]; return c && c[key] ? c[key][i] : null; }
  function gbps(v) { return F.isNum(v) ? F.bytes(v * 1e9) + "/s" : F.DASH; }
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

  function mountTable(root, d, ops) {
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
            writeHash({ component: d.path[i], find: null });
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
      columns: columns, count: d.path.length, pageSize: 100,
      onRefresh: function () { fitTypes(document.getElementById("cbsite-table")); },
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
    var hash = readHash();
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
     phase, no zoom) are left out; a plain anchor (#warnings) is not a state. */
  var HASH_KEYS = ["component", "find", "rank", "phase", "zoom"];
  function readHash() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var eq = part.indexOf("=");
      if (eq <= 0 || HASH_KEYS.indexOf(part.slice(0, eq)) < 0) return;
      try { out[part.slice(0, eq)] = decodeURIComponent(part.slice(eq + 1)); } catch (e) { /* a malformed value */ }
    });
    return out;
  }
  /* The address with `changes` (key -> value, null to drop) over the state it holds. */
  function writeHash(changes) {
    var now = readHash();
    Object.keys(changes).forEach(function (k) { if (changes[k] === null || changes[k] === undefined) delete now[k]; else now[k] = changes[k]; });
    var hash = HASH_KEYS.filter(function (k) { return k in now; }).map(function (k) { return k + "=" + encodeURIComponent(now[k]); }).join("&");
    if ((hash ? "#" + hash : "") === location.hash || !history.replaceState) return;
    history.replaceState(history.state, "", hash ? "#" + hash : location.pathname + location.search);
  }
  function mountAddress(d, run) {
    var phaseSel = document.getElementById("cbsite-phase"), rankSel = document.getElementById("cbsite-rank");
    var current = function () {
      return { rank: rankSel && rankSel.value !== "all" ? rankSel.value : null,
               phase: phaseSel.value !== d.phases[0] ? phaseSel.value : null,
               zoom: run.icicle.zoom > 0 ? d.path[run.icicle.zoom] : null };
    };
    var choose = function (sel, value) {
      if (!sel || value === undefined || sel.value === value) return;
      if (!Array.prototype.some.call(sel.options, function (o) { return o.value === value; })) return;
      sel.value = value;
      sel.dispatchEvent(new Event("change"));
    };
    var applying = false;
    var save = function () { if (!applying) writeHash(current()); };
    // The rank and phase first (the details panel and the zoom then show them), the component, then the zoom asked
    // for (over the component's parent, which opening a component zooms to).
    var apply = function (first) {
      var h = readHash();
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

  function fetchJson(url) {
    return fetch(url).then(function (r) { if (!r.ok) throw new Error(url + ": " + r.status); return r.json(); });
  }

  function start() {
    var root = document.getElementById("cbsite-run");
    if (!root) return;
    var opsUrl = root.getAttribute("data-ops");
    Promise.all([fetchJson(root.getAttribute("data-components")), opsUrl ? fetchJson(opsUrl) : Promise.resolve(null)])
      .then(function (res) {
        var d = res[0];
        if (!d.phases.length) { root.querySelector(".cbsite-loading").textContent = "This run has no rows."; return; }
        root.querySelector(".cbsite-loading").hidden = true;
        var kindColour = d.sharded ? { kind: { extra: true, label: "kind", kind: "category", categories: KIND, fmt: String,
          value: function (i, phase) { return col(d, phase, "kind", i); } } } : null;
        window.cbsiteRun = { data: d, icicle: mountIcicle(d, "cbsite", kindColour, d.sharded ? "kind" : null, d.sharded ? shardedTip(d) : null),
                             table: mountTable(root, d, res[1]), ops: res[1] };
        if (d.sharded) mountRanks(d, window.cbsiteRun);
        mountAddress(d, window.cbsiteRun);
        root.setAttribute("data-ready", "1");
      })
      .catch(function (err) {
        root.querySelector(".cbsite-loading").textContent = "Could not load the run data (" + err.message +
          "). Serve the site over HTTP (cbsite serve) rather than opening the files directly.";
      });
  }

  window.CbsiteRunPage = { metric: metric, mountIcicle: mountIcicle, fetchJson: fetchJson, label: label, fullPath: fullPath,
                           pathText: pathText };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
