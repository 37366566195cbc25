/* A model's component history page: the component named by #component=<path> across the model's versions, as
   small SVG line charts (a gap where a version has no value) and a table; a search box picks another path.
   Data: index.json (versions, runs, every path, where each series file starts) and the series file that holds the
   path: per path the places of the versions that have it and each series' values there (historydata.py). */
(function () {
  "use strict";
  var F = window.CbsiteFormat;
  var SVG = "http://www.w3.org/2000/svg";
  var CHARTS = [
    { key: "forward.latency_ms", title: "forward latency", fmt: F.ms },
    { key: "backward.latency_ms", title: "backward latency", fmt: F.ms },
    { key: "forward.flops", title: "forward FLOPs", fmt: F.flops },
    { key: "backward.flops", title: "backward FLOPs", fmt: F.flops },
    { key: "param_bytes", title: "size (parameters and buffers)", fmt: F.bytes },
    { key: "forward.peak_memory_bytes", title: "forward peak memory", fmt: F.bytes },
    { key: "backward.peak_memory_bytes", title: "backward peak memory", fmt: F.bytes }
  ];
  var MAX_MATCHES = 20;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function isNum(v) { return typeof v === "number" && isFinite(v); }

  /* The file (its number) that holds the i-th path: the last whose first path is at or before it. */
  function fileOf(starts, i) {
    var lo = 0, hi = starts.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (starts[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  /* One path's entry as series over every version: null where a version has no such component or no value. */
  function dense(entry, n) {
    var out = {};
    CHARTS.forEach(function (c) {
      var vals = entry ? entry[c.key] : null;
      if (!vals || !vals.some(isNum)) return;  // no value in any version: no chart
      var full = [];
      for (var i = 0; i < n; i++) full.push(null);
      entry.v.forEach(function (v, j) { full[v] = vals[j]; });
      out[c.key] = full;
    });
    return out;
  }

  /* One metric across the versions: a line broken where a value is missing, a point per value (its title says
     the version and value; a click opens that version's run page). */
  function chart(spec, values, index, runUrl) {
    var box = el("figure", "cbsite-history-chart");
    box.appendChild(el("figcaption", null, spec.title));
    var W = 320, H = 140, L = 8, R = 8, T = 20, B = 24, n = values.length;
    var nums = values.filter(isNum);
    var lo = Math.min(0, Math.min.apply(null, nums)), hi = Math.max.apply(null, nums);
    if (hi === lo) hi = lo + (lo === 0 ? 1 : Math.abs(lo));
    var x = function (i) { return n === 1 ? (L + W - R) / 2 : L + i * (W - L - R) / (n - 1); };
    var y = function (v) { return T + (H - T - B) * (1 - (v - lo) / (hi - lo)); };
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "class": "cbsite-history-svg",
      "aria-label": spec.title + " across " + n + " versions" });
    s.appendChild(svg("line", { x1: L, x2: W - R, y1: y(lo), y2: y(lo), "class": "cbsite-history-axis" }));
    var d = "", pen = false;
    values.forEach(function (v, i) {
      if (!isNum(v)) { pen = false; return; }
      d += (pen ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
      pen = true;
    });
    if (d) s.appendChild(svg("path", { d: d, "class": "cbsite-history-line" }));
    values.forEach(function (v, i) {
      if (!isNum(v)) return;
      var a = svg("a", { href: runUrl(i) });
      var c = svg("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: n > 60 ? 2 : 3.5, "class": "cbsite-history-point" });
      var t = svg("title", {});
      t.textContent = index.versions[i] + ": " + spec.fmt(v);
      c.appendChild(t);
      a.appendChild(c);
      s.appendChild(a);
    });
    // The first and the last value above the line, the first and the last version under it (long names cut).
    var known = [];
    values.forEach(function (v, i) { if (isNum(v)) known.push(i); });
    var cut = function (v) { return v.length > 18 ? v.slice(0, 17) + "\u2026" : v; };
    var text = function (x0, y0, anchor, cls, body) {
      var t = svg("text", { x: x0, y: y0, "text-anchor": anchor, "class": cls });
      t.textContent = body;
      s.appendChild(t);
    };
    if (known.length > 1) text(L, 11, "start", "cbsite-history-value", spec.fmt(values[known[0]]));
    if (known.length) text(W - R, 11, "end", "cbsite-history-value", spec.fmt(values[known[known.length - 1]]));
    text(n === 1 ? W / 2 : L, H - 5, n === 1 ? "middle" : "start", "cbsite-history-version", cut(index.versions[0]));
    if (n > 1) text(W - R, H - 5, "end", "cbsite-history-version", cut(index.versions[n - 1]));
    box.appendChild(s);
    return box;
  }

  function table(tbl, series, index, runUrl) {
    tbl.textContent = "";
    var shown = CHARTS.filter(function (c) { return series[c.key]; });
    var head = el("tr");
    head.appendChild(el("th", null, "version"));
    shown.forEach(function (c) { head.appendChild(el("th", "num", c.title)); });
    var thead = el("thead");
    thead.appendChild(head);
    tbl.appendChild(thead);
    var body = el("tbody");
    for (var i = index.versions.length - 1; i >= 0; i--) {  // newest first, as the model page lists them
      var tr = el("tr"), td = el("td"), a = el("a", null, index.versions[i]);
      a.href = runUrl(i);
      a.title = "run " + index.runs[i];
      td.appendChild(a);
      tr.appendChild(td);
      shown.forEach(function (c) { tr.appendChild(el("td", "num", c.fmt(series[c.key][i]))); });
      body.appendChild(tr);
    }
    tbl.appendChild(body);
    tbl.hidden = false;
  }

  function start() {
    var page = document.getElementById("cbsite-history");
    if (!page) return;
    var root = page.getAttribute("data-root"), model = page.getAttribute("data-model");
    var input = document.getElementById("cbsite-history-search"), list = document.getElementById("cbsite-history-matches");
    var count = document.getElementById("cbsite-history-count"), title = document.getElementById("cbsite-history-title");
    var charts = document.getElementById("cbsite-history-charts"), tbl = document.getElementById("cbsite-history-table");
    var loading = page.querySelector(".cbsite-loading");
    var files = {};
    var label = function (p) { return p === "" ? model : p; };
    var get = function (name) {
      if (!files[name]) files[name] = fetch(name).then(function (r) {
        if (!r.ok) throw new Error(name + ": HTTP " + r.status);
        return r.json();
      });
      return files[name];
    };
    get(page.getAttribute("data-index")).then(function (index) {
      var position = {};
      index.paths.forEach(function (p, i) { position[p] = i; });
      var runUrl = function (i) { return root + index.urls[i]; };
      count.textContent = index.paths.length + " components";

      function show(path) {
        var i = position[path];
        charts.textContent = "";
        title.hidden = false;
        if (i === undefined) {
          title.textContent = "No component at the path \u201c" + label(path) + "\u201d in any version";
          tbl.hidden = true;
          return Promise.resolve();
        }
        title.textContent = "";
        F.pathInto(title, label(path));
        return get(fileOf(index.starts, i) + ".json").then(function (chunk) {
          var entry = null;
          for (var j = 0; j < chunk.length; j++) if (chunk[j].path === path) { entry = chunk[j]; break; }
          var series = dense(entry, index.versions.length);
          CHARTS.forEach(function (c) { if (series[c.key]) charts.appendChild(chart(c, series[c.key], index, runUrl)); });
          if (!charts.firstChild) charts.appendChild(el("p", null, "No measured value in any version."));
          table(tbl, series, index, runUrl);
          page.setAttribute("data-shown", path);
        });
      }
      function fromHash() {
        var h = location.hash, key = "#component=";
        var path = h.indexOf(key) === 0 ? decodeURIComponent(h.slice(key.length)) : "";
        input.value = label(path);
        return show(path);
      }
      function matches() {
        var q = input.value.trim().toLowerCase();
        list.textContent = "";
        if (!q) return;
        var found = 0;
        for (var i = 0; i < index.paths.length && found < MAX_MATCHES; i++) {
          if (label(index.paths[i]).toLowerCase().indexOf(q) < 0) continue;
          var li = el("li"), a = el("a");
          F.pathInto(a, label(index.paths[i]));
          a.href = "#component=" + encodeURIComponent(index.paths[i]);
          a.addEventListener("click", function () { list.textContent = ""; });
          li.appendChild(a);
          list.appendChild(li);
          found++;
        }
        if (!found) list.appendChild(el("li", "cbsite-note", "no component path contains \u201c" + input.value.trim() + "\u201d"));
      }
      input.addEventListener("input", matches);
      input.addEventListener("keydown", function (e) {
        var a = list.querySelector("a");
        if (e.key === "Enter" && a) { location.hash = a.getAttribute("href"); list.textContent = ""; }
      });
      window.addEventListener("hashchange", fromHash);
      return fromHash().then(function () {
        if (loading) loading.remove();
        page.setAttribute("data-ready", "1");
      });
    }).catch(function (err) {
      if (loading) loading.textContent = "Could not load the history: " + err.message;
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
