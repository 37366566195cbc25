/* The icicle of a run with its phase, width and colour choices, its legend and its tooltips (the run page's, and
   the diff page's with the diff's colours and tooltip rows). */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var R = window.CbsiteRunPage = window.CbsiteRunPage || {};
  var WIDTH = R.WIDTH, phaseLabel = R.phaseLabel, BOUND_HELP = R.BOUND_HELP, KIND_HELP = R.KIND_HELP,
      COLOUR = R.COLOUR, boundColouring = R.boundColouring, metric = R.metric, SUSPECT_OF = R.SUSPECT_OF,
      NUMERATOR = R.NUMERATOR, utilText = R.utilText, slowerThanParent = R.slowerThanParent, boundOf = R.boundOf,
      label = R.label, fullPath = R.fullPath, status = R.status, span = R.span;

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
     `extraTip(i, phase)` rows to each node's tooltip, `mark(i)` an extra class of node i (given here, not set after,
     so that the icicle is drawn once on open). */
  function mountIcicle(d, prefix, extraColours, defaultColour, extraTip, mark) {
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
    if (mark) o.mark = mark;
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

  R.select = select; R.mountIcicle = mountIcicle;
})();
