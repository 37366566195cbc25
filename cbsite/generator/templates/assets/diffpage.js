/* The diff page: the per-component delta table (its answering columns first: latency change, ratio, verdict,
   bound) and an icicle of the newer run coloured by own change, its zoom and phase kept in the address.
   Data: diff.json (an index: phases, whether latency is judged, each phase's file), then the first phase's file
   (diffdata.py diff_files); another phase's file is fetched only when the table's or the icicle's phase selector
   asks for it, so a 10,000-component diff moves one phase on open. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var METRICS = {
    flops: { label: "FLOPs", fmt: F.flops },
    param_bytes: { label: "parameters", fmt: F.bytes },
    peak_memory_bytes: { label: "peak memory", fmt: F.bytes },
    latency_ms: { label: "latency", fmt: F.time },
    bytes_moved: { label: "bytes moved", fmt: F.bytes }
  };

  function deltaText(v, fmt, noise) {
    return F.signed(v, fmt) + (noise ? " (noise)" : "");
  }

  var CHANGE = { regressed: 1, improved: -1 };
  var COLUMN_ORDER = ["path", "d_latency_ms", "ratio", "verdict", "bound", "ci", "s_latency_ms", "kind", "module_type",
    "d_flops", "s_flops", "d_param_bytes", "s_param_bytes", "d_peak_memory_bytes"];
  var PAGE_ROWS = 10;  // the table's rows per page: the page opens short below the answer, the pager shows the rest
  var NOT_JUDGED = "latency not judged: single-round runs (collect with cbsite compare or cbsite collect --rounds N)";

  /* Latency as the page judges it (latencydata.py): with evidence, a change only where the verdict is
     regressed or improved (or the component is new or gone); without, the raw delta outside the IQR noise.
     Returns { value, changed, verdict (or null), note }. */
  function latencyAt(diff, phase, k) {
    var c = diff[phase], v = c.delta.latency_ms[k], kind = c.kind[k];
    if (kind === "added" || kind === "removed") return { value: v, changed: !!v, verdict: null, note: kind };
    if (!diff.judged) {
      var noise = c.noise.latency_ms[k];
      return { value: noise ? 0 : v, changed: !!v && !noise, verdict: null, note: noise ? "within noise (IQR), not judged" : "not judged" };
    }
    var verdict = c.latency.verdict[k];
    if (verdict === null) return { value: null, changed: false, verdict: null, note: "not timed on both sides" };
    return { value: CHANGE[verdict] ? v : 0, changed: !!CHANGE[verdict], verdict: verdict, note: verdict };
  }

  function verdictCell(diff, phase, k, td) {
    var s = document.createElement("span");
    if (!diff.judged) {
      s.className = "cbsite-verdict verdict-not-judged"; s.textContent = "not judged"; s.title = NOT_JUDGED;
    } else {
      var L = diff[phase].latency, v = L.verdict[k];
      if (v === null) { td.textContent = F.DASH; td.title = "not timed on both sides"; return; }
      s.className = "cbsite-verdict verdict-" + v.replace(" ", "-");
      s.textContent = v;
      s.title = L.reason[k] || "";
    }
    td.appendChild(s);
  }

  /* What bounds a component (diffbounds.py): the head run's label, "memory \u2192 compute" where it changed; the
     site's one taxonomy (communication in a sharded run, suspect beyond a peak), as the run page's badges. */
  function boundOf(c, k) {
    var now = c.run && c.run.bound ? c.run.bound[k] : null, was = c.bound_was ? c.bound_was[k] : null;
    return { now: now, was: was, text: was ? was + " \u2192 " + (now || "no label") : now };
  }
  function boundCell(c, k, td) {
    var b = boundOf(c, k);
    var badge = function (label, title) {
      var s = document.createElement("span");
      s.className = "cbsite-bound bound-" + label.replace(/ /g, "-");
      s.textContent = label === "communication" ? "comm." : label;
      s.title = title;
      td.appendChild(s);
    };
    if (b.was) { badge(b.was, "bound in the base run"); td.appendChild(document.createTextNode(" \u2192 ")); }
    if (b.now) badge(b.now, "bound in the head run" + (b.now === "communication" ? ": it issues collectives, so it waits for the other ranks" : ""));
    else { td.textContent += b.was ? "no label" : F.DASH; if (!b.was) td.title = "no label: no FLOPs and no bytes, or no latency, or not in the head run"; }
  }
  /* A sharded diff's own change that would subtract rows of different ranks (diffranks.py): each rank's instead. */
  function perRank(c, k, m) {
    var p = c.mixed ? c.mixed[k] : null;
    if (!p || !p[m]) return null;
    return Object.keys(p[m]).map(function (r) { return "rank " + r + " " + F.signed(p[m][r], METRICS[m].fmt); }).join(", ");
  }
  var MIXED = "own change not shown: in the all-ranks view each row is its own slowest rank, and this component's " +
    "change minus its children's would subtract rows of different ranks (see \"Own change per rank\")";

  /* A path as the run page's table writes it (the parent muted, the name bold), with a <wbr> after each "." and
     after each "_" inside a name longer than 12 characters (not a leading "_"): a phone's narrow path column breaks
     it there, never inside a word ("embedding_" / "bags."). */
  function pathCell(td, path, model) {
    var add = function (cls, text) {
      var e = document.createElement("span");
      e.className = cls;
      text.split(".").forEach(function (seg, j, segs) {
        var pieces = seg.split("_");
        pieces.forEach(function (piece, k) {
          e.appendChild(document.createTextNode(piece + (k < pieces.length - 1 ? "_" : "")));
          if (k < pieces.length - 1 && piece && seg.length > 12) e.appendChild(document.createElement("wbr"));
        });
        if (j < segs.length - 1) { e.appendChild(document.createTextNode(".")); e.appendChild(document.createElement("wbr")); }
      });
      td.appendChild(e);
    };
    if (path === "") { add("name", model); add("parent", " (root)"); return; }
    var cut = path.lastIndexOf(".");
    if (cut >= 0) add("parent", path.slice(0, cut + 1));
    add("name", path.slice(cut + 1));
  }

  function mountTable(diff, load, loading, failed) {
    var state = { phase: diff.phases[0] };
    var cols = function () { return diff[state.phase]; };
    var byKey = {};
    var add = function (col) { byKey[col.key] = col; };
    add({ key: "path", label: "path", value: function (i) { return cols().path[i]; },
        cell: function (i, td) {
          var c = cols(), root = document.getElementById("cbsite-diff").getAttribute("data-model");
          td.className = "path";
          td.style.paddingLeft = (0.3 + 0.6 * c.depth[i]) + "em";
          pathCell(td, c.path[i], root);
          td.title = c.base_path[i] !== null && c.base_path[i] !== c.path[i] ? "was " + c.base_path[i] : (c.path[i] || root);
        } });
    add({ key: "module_type", label: "module type", value: function (i) { return cols().module_type[i]; },
        cell: function (i, td) { td.className = "type"; td.textContent = cols().module_type[i].split(".").pop(); td.title = cols().module_type[i]; } });
    add({ key: "kind", label: "change", value: function (i) { return cols().kind[i]; },
        cell: function (i, td) { var s = document.createElement("span"); s.className = "cbsite-kind kind-" + cols().kind[i]; s.textContent = cols().kind[i]; td.appendChild(s);
          if (cols().missing[i].length) { s.title = "no value on a side for: " + cols().missing[i].join(", "); s.textContent += " *"; } } });
    add({ key: "bound", label: "bound", title: "what bounds its time in the head run (compute, memory, overhead; communication in a " +
          "sharded run; suspect beyond a peak); base \u2192 head where it changed",
        value: function (i) { return boundOf(cols(), i).text; },
        cell: function (i, td) { boundCell(cols(), i, td); } });
    ["flops", "param_bytes", "peak_memory_bytes", "latency_ms"].forEach(function (m) {
      var spec = METRICS[m];
      add({ key: "d_" + m, label: "\u0394 " + spec.label, numeric: true, title: "change per forward (head \u2212 base)" +
          (m === "latency_ms" ? (diff.judged ? "; coloured only where the verdict is regressed or improved" : "; latency not judged") : ""),
        value: function (i) { return cols().delta[m][i]; },
        cell: function (i, td) {
          var v = cols().delta[m][i];
          if (m === "latency_ms") {
            var lat = latencyAt(diff, state.phase, i);
            td.textContent = F.signed(v, spec.fmt);
            td.title = lat.note;
            if (lat.changed) td.classList.add(v > 0 ? "up" : "down");
            return;
          }
          var noise = cols().noise[m][i];
          td.textContent = deltaText(v, spec.fmt, noise);
          if (typeof v === "number" && v !== 0 && !noise) td.classList.add(v > 0 ? "up" : "down"); } });
      if (m === "peak_memory_bytes") return;  // maxima: own changes do not add up, so no share
      add({ key: "s_" + m, label: "own %", numeric: true,
        title: "this component's own change of " + spec.label + " (its change minus its children's) as a share of the " +
          "whole model's change; a container whose children explain its change has 0 %" +
          (m === "latency_ms" ? "; only where the latency changed" : "") + "; none where the own changes cancel out" +
          "; in a sharded diff none where it would mix ranks (its title gives each rank's own change)",
        value: function (i) { return cols().share[m][i]; },
        cell: function (i, td) {
          td.textContent = F.pct(cols().share[m][i]);
          var ranks = perRank(cols(), i, m);
          if (ranks) { td.title = MIXED + ". Per rank: " + ranks; td.classList.add("cbsite-mixed"); }
        } });
      if (m !== "latency_ms") return;
      var L = function () { return cols().latency; };
      add({ key: "verdict", label: "verdict", title: "latency verdict of this component and phase",
        value: function (i) { return diff.judged ? L().verdict[i] : null; },
        cell: function (i, td) { verdictCell(diff, state.phase, i, td); } });
      add({ key: "ratio", label: "ratio", numeric: true, title: "latency head/base (point estimate of the verdict)",
        value: function (i) { return diff.judged ? L().ratio[i] : null; },
        cell: function (i, td) { td.textContent = diff.judged ? F.ratio(L().ratio[i]) : F.DASH; } });
      add({ key: "ci", label: "95 % interval", numeric: true, title: "95 % interval of the latency ratio head/base",
        value: function (i) { return diff.judged ? L().ci_low[i] : null; },
        cell: function (i, td) { td.textContent = diff.judged ? F.interval(L().ci_low[i], L().ci_high[i]) : F.DASH; } });
    });
    // The columns that answer "what got slower, and is it real?" first (a phone shows them without scrolling the
    // table), then the kind of change and the other metrics.
    var columns = COLUMN_ORDER.map(function (k) { return byKey[k]; });
    var t = new window.CbsiteTable(document.getElementById("cbsite-difftable"), {
      columns: columns, count: cols().path.length, pageSize: PAGE_ROWS, sort: { key: "s_flops", desc: true },
      text: function (i) { return cols().path[i]; },
      depth: function (i) { return cols().depth[i]; },
      extraControls: function (bar) {
        if (diff.phases.length < 2) return;
        var s = document.createElement("select");
        s.setAttribute("aria-label", "phase");
        diff.phases.forEach(function (p) { var o = document.createElement("option"); o.value = p; o.textContent = p; s.appendChild(o); });
        s.addEventListener("change", function () {
          var want = s.value;
          loading(true);
          load(want).then(function () {
            loading(false);
            if (s.value !== want) return;  // another phase was chosen meanwhile
            state.phase = want; t.spec.count = cols().path.length; t.refresh();
          }, function (err) { loading(false); failed(err); });
        });
        bar.appendChild(s);
        var note = document.createElement("span");
        note.className = "cbsite-phase-loading"; note.hidden = true; note.textContent = "loading the phase\u2026";
        bar.appendChild(note);
      }
    });
    return t;
  }

  /* Paths from the phase file's parent row and last segment (diffdata.py encode_paths). */
  function decodePaths(parent, name) {
    var out = new Array(parent.length);
    for (var i = 0; i < parent.length; i++) {
      var k = parent[i];
      out[i] = k < 0 ? name[i] : (out[k] ? out[k] + "." + name[i] : name[i]);
    }
    return out;
  }

  /* The icicle's tree is the first phase's rows (the head run's components, and the removed ones, which have no
     head value and are not drawn); another phase's run values are placed on it by path when that phase loads. */
  function treeOf(index, c) {
    var n = c.path.length;
    var parent = c.parent.map(function (k, i) { return k < i ? k : -1; });
    var name = c.path.map(function (s) { return s.slice(s.lastIndexOf(".") + 1); });
    return { model: index.model || "", phases: index.phases.slice(), path: c.path, parent: parent, name: name,
             module_type: c.module_type, depth: c.depth, call_count: c.run ? c.run.call_count : new Array(n).fill(1),
             param_bytes: c.run ? c.run.param_bytes : new Array(n).fill(null) };
  }

  function start() {
    var root = document.getElementById("cbsite-diff");
    if (!root || !root.getAttribute("data-diff")) return;
    var get = window.CbsiteRunPage.fetchJson;
    var url = root.getAttribute("data-diff"), note = root.querySelector(".cbsite-loading");
    var diff = null, head = null, at = {}, pending = {}, busy = 0;
    var failed = function (err) {
      note.hidden = false;
      note.textContent = "Could not load the diff data (" + err.message + "). Serve the site over HTTP (cbsite serve).";
    };
    /* While a phase's file loads: a note beside the controls, and data-loading="1" on the page. */
    var loading = function (on) {
      busy = Math.max(0, busy + (on ? 1 : -1));
      Array.prototype.forEach.call(root.querySelectorAll(".cbsite-phase-loading"), function (e) { e.hidden = busy === 0; });
      root.setAttribute("data-loading", busy ? "1" : "0");
    };
    /* A phase's file, fetched once (a promise); its run values are placed on the icicle's tree by path. */
    var load = function (phase) {
      if (diff[phase]) return Promise.resolve(diff[phase]);
      if (!pending[phase]) {
        pending[phase] = get(diff.files[phase]).then(function (c) {
          c.path = decodePaths(c.parent, c.name);
          if (head) {
            var idx = {};
            c.path.forEach(function (path, k) { if (c.kind[k] !== "removed") idx[path] = k; });
            at[phase] = head.path.map(function (path) { return idx.hasOwnProperty(path) ? idx[path] : -1; });
            var cols = {};
            Object.keys(c.run || {}).forEach(function (key) {
              var src = c.run[key];
              cols[key] = at[phase].map(function (k) { return k < 0 ? null : src[k]; });
            });
            head[phase] = cols;
          }
          diff[phase] = c;
          return c;
        });
        pending[phase].catch(function () { delete pending[phase]; });  // a failed fetch may be tried again
      }
      return pending[phase];
    };
    get(root.getAttribute("data-diff")).then(function (index) {
      diff = index;
      return load(index.phases[0]);
    }).then(function (first) {
      head = treeOf(diff, first);
      at[diff.phases[0]] = first.path.map(function (_, k) { return k; });  // the tree's own rows
      head[diff.phases[0]] = first.run || {};
      note.hidden = true;
      var extra = {};
      Object.keys(METRICS).forEach(function (m) {
        var spec = METRICS[m];
        // A node's own change (its change minus its children's): a container whose children changed stays white.
        extra["delta_" + m] = { label: "own \u0394 " + spec.label, kind: "diverging", extra: true, fmt: function (v) { return F.signed(v, spec.fmt); },
          value: function (i, phase) {
            if (!diff[phase]) return null;
            var k = at[phase][i];
            if (k < 0) return null;
            if (m === "latency_ms") return latencyAt(diff, phase, k).value === 0 ? 0 : diff[phase].own[m][k];
            return diff[phase].noise[m][k] ? 0 : diff[phase].own[m][k];  // noise is not a change
          } };
      });
      // Judged latency is drawn as the log of its verdict's ratio (a 2.5x regression of a 20 us node shows as
      // strongly as one of a 2 ms node); white where the verdict is not a change.
      if (diff.judged) {
        extra.delta_latency_ms = { label: "latency ratio (log)", kind: "diverging", extra: true,
          fmt: function (v) { return F.isNum(v) ? F.ratio(Math.exp(v)) : F.DASH; },
          value: function (i, phase) {
            if (!diff[phase]) return null;
            var k = at[phase][i];
            if (k < 0) return null;
            var lat = latencyAt(diff, phase, k), r = diff[phase].latency.ratio[k];
            if (lat.verdict === null) return null;
            return lat.changed && r > 0 ? Math.log(r) : 0;
          } };
      }
      if (diff.judged) Object.keys(extra).forEach(function (k) { extra[k].legend = "dark outline: latency regressed (judged)"; });
      extra.delta_latency_ms.legend = diff.judged ? "dark outline: latency regressed (judged); " +
        "the verdict's ratio head/base, drawn only where it is regressed or improved (unchanged and inconclusive: white; not timed on both sides: grey)" :
        "latency not judged (single-round runs): raw change, within-run IQR noise drawn as none";
      // The tooltip of a node: where its bound changed, the base run's label (the run page's tooltip above gives
      // the head run's); each rank's own change where the all-ranks one would mix ranks; its latency verdict,
      // ratio and interval in the phase shown.
      var tip = function (i, phase) {
        var k = diff[phase] ? at[phase][i] : -1;
        if (k < 0) return [];
        var c = diff[phase], lat = latencyAt(diff, phase, k), b = boundOf(c, k);
        var rows = [];
        if (b.was) rows.push(["bound, base \u2192 head", b.text]);
        Object.keys(METRICS).forEach(function (m) {
          var ranks = perRank(c, k, m);
          if (ranks) rows.push(["own \u0394 " + METRICS[m].label + " per rank", ranks + " (not for all ranks: rows of different ranks)", "warn"]);
        });
        rows.push(["latency medians", F.time(c.base.latency_ms[k]) + " \u2192 " + F.time(c.head.latency_ms[k]) +
          " (" + F.signed(c.delta.latency_ms[k], F.time) + ")"]);
        if (!diff.judged) { rows.push(["latency verdict", "not judged"]); return rows; }
        if (lat.verdict === null) { rows.push(["latency verdict", lat.note]); return rows; }
        rows.push(["latency verdict", lat.verdict]);
        rows.push(["ratio (95 % interval)", F.ratio(c.latency.ratio[k]) + " (" + F.interval(c.latency.ci_low[k], c.latency.ci_high[k]) + ")"]);
        if (c.latency.reason[k] && lat.verdict === "inconclusive") rows.push(["", c.latency.reason[k]]);
        return rows;
      };
      // Nodes whose latency regressed (a judged verdict) are outlined, whatever the colouring.
      var phaseSel = document.getElementById("cbsite-phase");
      var regressed = function (i) {
        var phase = phaseSel.value || diff.phases[0], k = diff[phase] ? at[phase][i] : -1;
        return k >= 0 && diff.judged && diff[phase].latency.verdict[k] === "regressed" ? "regressed" : "";
      };
      var icicle = window.CbsiteRunPage.mountIcicle(head, "cbsite", extra, root.getAttribute("data-colour") || "delta_flops",
                                                    tip, regressed);
      // The icicle's phase selector: a phase not loaded yet is fetched, then drawn (mountIcicle redraws at once,
      // with no values, and again here once they are in).
      var sel = document.getElementById("cbsite-phase");
      sel.addEventListener("change", function () {
        var want = sel.value;
        if (diff[want]) return;
        loading(true);
        load(want).then(function () { loading(false); if (sel.value === want) icicle.render(); },
                        function (err) { loading(false); failed(err); });
      });
      window.cbsiteDiff = { diff: diff, head: head, icicle: icicle, table: mountTable(diff, load, loading, failed), load: load };
      mountAddress(diff, head, icicle);
      root.setAttribute("data-ready", "1");
    }).catch(failed);
  }
  /* The page's state in its address, as the run page keeps it (runlinks.js mountAddress): #phase=P (the icicle's
     phase; the table follows it when the address is applied) and #zoom=PATH (the icicle's zoomed node), joined by
     "&" (address.js, which the run page's address shares). A link with them opens the page so, and back/forward to
     such an address applies it again. Defaults (the first phase, no zoom) are left out; a plain anchor (#latency) is
     not a state, and an address with no hash at all is the defaults. */
  var address = new window.CbsiteAddress(["phase", "zoom"]);
  function mountAddress(diff, head, icicle) {
    var phaseSel = document.getElementById("cbsite-phase");
    var tableSel = document.querySelector("#cbsite-difftable select[aria-label='phase']");
    var current = function () {
      return { phase: phaseSel.value !== diff.phases[0] ? phaseSel.value : null,
               zoom: icicle.zoom > 0 ? head.path[icicle.zoom] : null };
    };
    var choose = window.CbsiteAddress.choose;
    var applying = false;
    var save = function () { if (!applying) address.write(current()); };
    var apply = function (first) {
      var h = address.read(), plain = location.hash.replace(/^#/, "") !== "";
      if (!Object.keys(h).length && (first || plain)) return;
      applying = true;
      choose(phaseSel, h.phase || diff.phases[0]);
      choose(tableSel, h.phase || diff.phases[0]);
      var z = "zoom" in h ? head.path.indexOf(h.zoom) : 0;
      if (z >= 0 && z !== icicle.zoom) icicle.zoomTo(z);
      applying = false;
      save();
    };
    phaseSel.addEventListener("change", save);
    icicle.opts.onZoom = save;
    apply(true);
    window.addEventListener("hashchange", function () { apply(false); });
  }

  /* The collapsed sections (<details class="cbsite-more">): a link to one (#latency) opens it, and opening one
     redraws its charts (Vega sizes a "container"-wide chart when the window resizes; closed, it had no width). */
  function sections() {
    var open = function () {
      var id = decodeURIComponent(location.hash.slice(1));
      var el = id && document.getElementById(id);
      for (var a = el; a; a = a.parentElement) if (a.tagName === "DETAILS") a.open = true;
      if (el) el.scrollIntoView();
    };
    Array.prototype.forEach.call(document.querySelectorAll("details.cbsite-more"), function (d) {
      d.addEventListener("toggle", function () { if (d.open) window.dispatchEvent(new Event("resize")); });
    });
    window.addEventListener("hashchange", open);
    if (location.hash) open();
  }
  function ready() { sections(); start(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready); else ready();
})();
