/* The diff page: the per-component delta table and an icicle of the newer run coloured by delta. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var METRICS = {
    flops: { label: "FLOPs", fmt: F.flops },
    param_bytes: { label: "parameters", fmt: F.bytes },
    peak_memory_bytes: { label: "peak memory", fmt: F.bytes },
    latency_ms: { label: "latency", fmt: F.ms },
    bytes_moved: { label: "bytes moved", fmt: F.bytes }
  };

  function deltaText(v, fmt, noise) {
    return F.signed(v, fmt) + (noise ? " (noise)" : "");
  }

  var CHANGE = { regressed: 1, improved: -1 };
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

  function mountTable(diff) {
    var state = { phase: diff.phases[0] };
    var cols = function () { return diff[state.phase]; };
    var columns = [
      { key: "path", label: "path", value: function (i) { return cols().path[i]; },
        cell: function (i, td) {
          var c = cols(), root = document.getElementById("cbsite-diff").getAttribute("data-model");
          td.className = "path";
          td.style.paddingLeft = (0.3 + 0.6 * c.depth[i]) + "em";
          window.CbsiteRunPage.pathText(td, c.path[i], root);
          td.title = c.base_path[i] !== null && c.base_path[i] !== c.path[i] ? "was " + c.base_path[i] : (c.path[i] || root);
        } },
      { key: "module_type", label: "module type", value: function (i) { return cols().module_type[i]; },
        cell: function (i, td) { td.className = "type"; td.textContent = cols().module_type[i].split(".").pop(); td.title = cols().module_type[i]; } },
      { key: "kind", label: "change", value: function (i) { return cols().kind[i]; },
        cell: function (i, td) { var s = document.createElement("span"); s.className = "cbsite-kind kind-" + cols().kind[i]; s.textContent = cols().kind[i]; td.appendChild(s);
          if (cols().missing[i].length) { s.title = "no value on a side for: " + cols().missing[i].join(", "); s.textContent += " *"; } } }
    ];
    ["flops", "param_bytes", "peak_memory_bytes", "latency_ms"].forEach(function (m) {
      var spec = METRICS[m];
      columns.push({ key: "d_" + m, label: "\u0394 " + spec.label, numeric: true, title: "change per forward (head \u2212 base)" +
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
      columns.push({ key: "s_" + m, label: "share", numeric: true,
        title: "this component's own change of " + spec.label + " as a share of the whole model's change" +
          (m === "latency_ms" ? " (only where the latency changed)" : ""),
        value: function (i) { return cols().share[m][i]; },
        cell: function (i, td) { td.textContent = F.pct(cols().share[m][i]); } });
      if (m !== "latency_ms") return;
      var L = function () { return cols().latency; };
      columns.push({ key: "verdict", label: "verdict", title: "latency verdict of this component and phase",
        value: function (i) { return diff.judged ? L().verdict[i] : null; },
        cell: function (i, td) { verdictCell(diff, state.phase, i, td); } });
      columns.push({ key: "ratio", label: "ratio", numeric: true, title: "latency head/base (point estimate of the verdict)",
        value: function (i) { return diff.judged ? L().ratio[i] : null; },
        cell: function (i, td) { td.textContent = diff.judged ? F.ratio(L().ratio[i]) : F.DASH; } });
      columns.push({ key: "ci", label: "95 % interval", numeric: true, title: "95 % interval of the latency ratio head/base",
        value: function (i) { return diff.judged ? L().ci_low[i] : null; },
        cell: function (i, td) { td.textContent = diff.judged ? F.interval(L().ci_low[i], L().ci_high[i]) : F.DASH; } });
    });
    var t = new window.CbsiteTable(document.getElementById("cbsite-difftable"), {
      columns: columns, count: cols().path.length, pageSize: 100, sort: { key: "s_flops", desc: true },
      text: function (i) { return cols().path[i]; },
      depth: function (i) { return cols().depth[i]; },
      extraControls: function (bar) {
        if (diff.phases.length < 2) return;
        var s = document.createElement("select");
        s.setAttribute("aria-label", "phase");
        diff.phases.forEach(function (p) { var o = document.createElement("option"); o.value = p; o.textContent = p; s.appendChild(o); });
        s.addEventListener("change", function () { state.phase = s.value; t.spec.count = cols().path.length; t.refresh(); });
        bar.appendChild(s);
      }
    });
    return t;
  }

  function start() {
    var root = document.getElementById("cbsite-diff");
    if (!root || !root.getAttribute("data-diff")) return;
    var get = window.CbsiteRunPage.fetchJson;
    Promise.all([get(root.getAttribute("data-diff")), get(root.getAttribute("data-head"))]).then(function (res) {
      var diff = res[0], head = res[1];
      root.querySelector(".cbsite-loading").hidden = true;
      // Align the diff's rows with the head run's components by path, per phase.
      var at = {};
      diff.phases.forEach(function (p) {
        var idx = {};
        diff[p].path.forEach(function (path, k) { if (diff[p].kind[k] !== "removed") idx[path] = k; });
        at[p] = head.path.map(function (path) { return idx.hasOwnProperty(path) ? idx[path] : -1; });
      });
      var extra = {};
      Object.keys(METRICS).forEach(function (m) {
        var spec = METRICS[m];
        extra["delta_" + m] = { label: "\u0394 " + spec.label, kind: "diverging", extra: true, fmt: function (v) { return F.signed(v, spec.fmt); },
          value: function (i, phase) {
            if (!diff[phase]) return null;
            var k = at[phase][i];
            if (k < 0) return null;
            if (m === "latency_ms") return latencyAt(diff, phase, k).value;  // only a verdict's change is drawn
            return diff[phase].noise[m][k] ? 0 : diff[phase].delta[m][k];  // noise is not a change
          } };
      });
      extra.delta_latency_ms.legend = diff.judged ?
        "latency drawn only where its verdict is regressed or improved (unchanged and inconclusive: white; not timed on both sides: grey)" :
        "latency not judged (single-round runs): raw change, within-run IQR noise drawn as none";
      // The tooltip of a node: its latency verdict, ratio and interval in the phase shown.
      var tip = function (i, phase) {
        var k = diff[phase] ? at[phase][i] : -1;
        if (k < 0) return [];
        var c = diff[phase], lat = latencyAt(diff, phase, k);
        var rows = [["latency medians", F.ms(c.base.latency_ms[k]) + " \u2192 " + F.ms(c.head.latency_ms[k]) +
          " (" + F.signed(c.delta.latency_ms[k], F.ms) + ")"]];
        if (!diff.judged) { rows.push(["latency verdict", "not judged"]); return rows; }
        if (lat.verdict === null) { rows.push(["latency verdict", lat.note]); return rows; }
        rows.push(["latency verdict", lat.verdict]);
        rows.push(["ratio (95 % interval)", F.ratio(c.latency.ratio[k]) + " (" + F.interval(c.latency.ci_low[k], c.latency.ci_high[k]) + ")"]);
        if (c.latency.reason[k] && lat.verdict === "inconclusive") rows.push(["", c.latency.reason[k]]);
        return rows;
      };
      // The icicle shows the phases both runs have.
      head.phases = head.phases.filter(function (p) { return diff.phases.indexOf(p) >= 0; });
      window.cbsiteDiff = { diff: diff, head: head,
        icicle: window.CbsiteRunPage.mountIcicle(head, "cbsite", extra, root.getAttribute("data-colour") || "delta_flops", tip), table: mountTable(diff) };
      root.setAttribute("data-ready", "1");
    }).catch(function (err) {
      root.querySelector(".cbsite-loading").textContent = "Could not load the diff data (" + err.message +
        "). Serve the site over HTTP (cbsite serve).";
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
