/* A run's components.json columns as the run and diff pages read them: each metric per forward of the model, the
   bounds and their colours, the marks of a suspect or inverted value, names and paths, and small DOM helpers. */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};

  /* `phased`: the name in a phase, which it names ("backward latency per forward of the model"), never the bare
     "latency per forward" that reads as the forward's in the backward phase (phaseLabel). */
  var WIDTH = {
    latency_ms: { label: "latency per forward", phased: "%s latency per forward of the model", fmt: F.ms },
    flops: { label: "FLOPs per forward", phased: "%s FLOPs per forward of the model", fmt: F.flops },
    param_bytes: { label: "parameter bytes", fmt: F.bytes },
    peak_memory_bytes: { label: "peak memory", phased: "%s peak memory", fmt: F.bytes }
  };
  function phaseLabel(spec, phase) { return spec.phased && phase ? spec.phased.replace("%s", phase) : spec.label; }
  /* What bounds a component (cbsite/bound.py); the same colours as the roofline (roofline.py BOUND_COLOURS). A sharded
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

  function text(td, s, title) { td.textContent = s; if (title) td.title = title; }

  function span(parent, cls, text, title) {
    var e = document.createElement("span");
    if (cls) e.className = cls;
    if (text) e.textContent = text;
    if (title) e.title = title;
    parent.appendChild(e);
    return e;
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

  function fetchJson(url) {
    return fetch(url).then(function (r) { if (!r.ok) throw new Error(url + ": " + r.status); return r.json(); });
  }

  R.WIDTH = WIDTH; R.phaseLabel = phaseLabel; R.BOUND = BOUND; R.BOUND_HELP = BOUND_HELP; R.COLOUR = COLOUR;
  R.boundColouring = boundColouring; R.calls = calls; R.metric = metric; R.SUSPECT_OF = SUSPECT_OF;
  R.NUMERATOR = NUMERATOR; R.utilText = utilText; R.utilCell = utilCell; R.slowerThanParent = slowerThanParent;
  R.onRank = onRank; R.rankAbove = rankAbove; R.latencyCell = latencyCell; R.boundOf = boundOf; R.label = label;
  R.fullPath = fullPath; R.status = status; R.link = link; R.text = text; R.span = span; R.hasAny = hasAny;
  R.hasArtifacts = hasArtifacts; R.KIND = KIND; R.KIND_HELP = KIND_HELP; R.col = col; R.gbps = gbps;
  R.fetchJson = fetchJson;
})();
