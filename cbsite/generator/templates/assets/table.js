/* cbsite table: rows filled from JSON in the browser (never in the page, so pages stay small and out of the
   search index), sortable by any column, filterable by path text and depth, shown a page at a time. */
(function (global) {
  "use strict";

  /* spec: { columns: [{key, label, title, numeric, value(i), cell(i, td)}], count, visible(column) -> shown?,
             text(i) -> string to filter on, depth(i) -> int, sort: {key, desc}, pageSize, onRow(i),
             tableClass: classes of the <table> from the start (the layout the page expects, laid out once),
             firstRows: rows of the first drawing built a task at a time, put in the page together (refresh) } */
  function Table(container, spec) {
    this.c = container;
    this.spec = spec;
    this.sortKey = spec.sort ? spec.sort.key : null;
    this.desc = spec.sort ? !!spec.sort.desc : false;
    this.filter = "";
    this.maxDepth = null;
    this.page = 0;
    this.pageSize = spec.pageSize || 100;
    this.only = null;  // {key, value}: only the rows whose column `key` has this value (showOnly)
    container.cbsiteTable = this;  // for the page's other views (the run page's time by module type)
    this._build();
    this.refresh();
  }

  Table.prototype._build = function () {
    var self = this, spec = this.spec;
    this.c.textContent = "";
    var bar = document.createElement("div");
    bar.className = "cbsite-table-bar";
    var input = document.createElement("input");
    input.type = "search";
    input.placeholder = "filter by path\u2026";
    input.className = "cbsite-filter";
    input.setAttribute("aria-label", "filter rows by path");
    input.addEventListener("input", function () { self.filter = input.value.toLowerCase(); self.page = 0; self.refresh(); });
    bar.appendChild(input);
    var maxD = 0;
    for (var i = 0; i < spec.count; i++) maxD = Math.max(maxD, spec.depth(i));
    var sel = document.createElement("select");
    sel.className = "cbsite-depth";
    sel.setAttribute("aria-label", "maximum depth");
    var opt = document.createElement("option");
    opt.value = ""; opt.textContent = "all depths";
    sel.appendChild(opt);
    for (var d = 0; d <= maxD; d++) {
      opt = document.createElement("option");
      opt.value = String(d); opt.textContent = "depth \u2264 " + d;
      sel.appendChild(opt);
    }
    sel.addEventListener("change", function () { self.maxDepth = sel.value === "" ? null : Number(sel.value); self.page = 0; self.refresh(); });
    bar.appendChild(sel);
    if (spec.extraControls) spec.extraControls(bar);
    if (spec.groupControls) spec.groupControls(bar);
    this.info = document.createElement("span");
    this.info.className = "cbsite-table-info";
    bar.appendChild(this.info);
    this.onlyNote = document.createElement("span");
    this.onlyNote.className = "cbsite-table-only";
    this.onlyNote.hidden = true;
    bar.appendChild(this.onlyNote);
    this.c.appendChild(bar);

    var wrap = document.createElement("div");
    wrap.className = "cbsite-table-wrap";
    var table = document.createElement("table");
    table.className = "cbsite-table" + (spec.tableClass ? " " + spec.tableClass : "");
    var thead = document.createElement("thead"), tr = document.createElement("tr");
    this.headers = {};
    spec.columns.forEach(function (col) {
      var th = document.createElement("th");
      th.textContent = col.label;
      if (col.title) th.title = col.title;
      if (col.numeric) th.className = "num";
      if (col.value) {
        th.classList.add("sortable");
        th.tabIndex = 0;
        th.setAttribute("data-key", col.key);
        var go = function () {
          if (self.sortKey === col.key) self.desc = !self.desc;
          else { self.sortKey = col.key; self.desc = !!col.numeric; }
          self.page = 0;
          self.refresh();
        };
        th.addEventListener("click", go);
        th.addEventListener("keydown", function (e) { if (e.key === "Enter") go(); });
      }
      self.headers[col.key] = th;
      th.hidden = !self._shows(col);
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    table.appendChild(thead);
    this.tbody = document.createElement("tbody");
    table.appendChild(this.tbody);
    wrap.appendChild(table);
    this.c.appendChild(wrap);

    var pager = document.createElement("div");
    pager.className = "cbsite-pager";
    this.prev = document.createElement("button");
    this.prev.textContent = "\u2190 previous";
    this.prev.addEventListener("click", function () { self.page--; self.refresh(); });
    this.next = document.createElement("button");
    this.next.textContent = "next \u2192";
    this.next.addEventListener("click", function () { self.page++; self.refresh(); });
    this.pageInfo = document.createElement("span");
    pager.appendChild(this.prev); pager.appendChild(this.pageInfo); pager.appendChild(this.next);
    this.c.appendChild(pager);
  };

  /* Whether a column is shown (spec.visible: a choice of columns, such as a sharded run's communication ones). */
  Table.prototype._shows = function (col) { return !this.spec.visible || this.spec.visible(col); };

  /* Show the columns spec.visible now picks (after the choice behind it changed) and redraw the rows. */
  Table.prototype.setVisible = function () {
    var self = this;
    this.spec.columns.forEach(function (col) { self.headers[col.key].hidden = !self._shows(col); });
    this.refresh();
  };

  Table.prototype.rows = function () {
    var spec = this.spec, out = [], onlyCol = null;
    if (this.only) for (var k = 0; k < spec.columns.length; k++) if (spec.columns[k].key === this.only.key) onlyCol = spec.columns[k];
    for (var i = 0; i < spec.count; i++) {
      if (this.maxDepth !== null && spec.depth(i) > this.maxDepth) continue;
      if (this.filter && spec.text(i).toLowerCase().indexOf(this.filter) < 0) continue;
      if (onlyCol && onlyCol.value(i) !== this.only.value) continue;
      out.push(i);
    }
    var col = null;
    for (var c = 0; c < spec.columns.length; c++) if (spec.columns[c].key === this.sortKey) col = spec.columns[c];
    if (col) {
      var desc = this.desc, val = col.value;
      var keyed = out.map(function (i) { return [val(i), i]; });
      keyed.sort(function (a, b) {
        var x = a[0], y = b[0];
        var xn = x === null || x === undefined || (typeof x === "number" && !isFinite(x));
        var yn = y === null || y === undefined || (typeof y === "number" && !isFinite(y));
        if (xn || yn) return xn === yn ? a[1] - b[1] : (xn ? 1 : -1);  // missing values last, either way
        var r = typeof x === "string" ? x.localeCompare(y) : x - y;
        if (r === 0) return a[1] - b[1];
        return desc ? -r : r;
      });
      out = keyed.map(function (p) { return p[1]; });
    }
    return out;
  };

  /* Only the rows whose column `key` equals `value` (null: all rows again), with a note in the bar that clears it. */
  Table.prototype.showOnly = function (key, value, label) {
    var self = this;
    this.only = value === null || value === undefined ? null : { key: key, value: value };
    this.onlyNote.textContent = "";
    this.onlyNote.hidden = !this.only;
    if (this.only) {
      this.onlyNote.appendChild(document.createTextNode("only " + (label || value) + " "));
      var clear = document.createElement("button");
      clear.type = "button";
      clear.textContent = "show all";
      clear.addEventListener("click", function () { self.showOnly(key, null); });
      this.onlyNote.appendChild(clear);
    }
    this.page = 0;
    this.refresh();
  };

  /* The rows of the page shown. The first drawing, where spec.firstRows is given, builds that many rows a task (a task
     after the next frame), so that building a long table never holds the main thread for long, and puts them in the
     page together once all are built: the browser lays out and paints the table once, not once a task;
     spec.onRefresh, and whenDrawn's callbacks, run once every row is in. */
  Table.prototype.refresh = function () {
    var spec = this.spec, self = this;
    var rows = this.rows();
    var pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.max(0, Math.min(this.page, pages - 1));
    var start = this.page * this.pageSize, shown = rows.slice(start, start + this.pageSize);
    var step = this.drawings || !spec.firstRows ? shown.length : spec.firstRows;
    var drawing = this.drawings = (this.drawings || 0) + 1;
    this.pending = true;
    this.tbody.textContent = "";
    var frag = document.createDocumentFragment();
    var put = function (from) {
      if (self.drawings !== drawing) return;  // a newer drawing replaced these rows
      shown.slice(from, from + step).forEach(function (i) { frag.appendChild(self._row(i)); });
      if (from + step < shown.length) {
        requestAnimationFrame(function () { setTimeout(function () { put(from + step); }, 0); });
        return;
      }
      self.tbody.appendChild(frag);
      self.pending = false;
      if (spec.onRefresh) spec.onRefresh(self);
      var waiting = self.waiting || [];
      self.waiting = [];
      waiting.forEach(function (fn) { fn(); });
    };
    for (var key in this.headers) {
      var th = this.headers[key];
      th.removeAttribute("aria-sort");
      if (key === this.sortKey) th.setAttribute("aria-sort", this.desc ? "descending" : "ascending");
    }
    this.info.textContent = rows.length + " of " + spec.count + " rows";
    this.pageInfo.textContent = " page " + (this.page + 1) + " of " + pages + " ";
    this.prev.disabled = this.page === 0;
    this.next.disabled = this.page >= pages - 1;
    put(0);
  };

  /* `fn` once the rows of the page shown are all in (at once where they are). */
  Table.prototype.whenDrawn = function (fn) {
    if (!this.pending) fn(); else (this.waiting = this.waiting || []).push(fn);
  };

  Table.prototype._row = function (i) {
    var spec = this.spec, self = this, tr = document.createElement("tr");
    tr.setAttribute("data-index", i);
    spec.columns.forEach(function (col) {
      var td = document.createElement("td");
      if (col.numeric) td.className = "num";
      // A column not chosen keeps its (hidden, empty) cell: the n-th cell is the n-th header's.
      if (!self._shows(col)) { td.hidden = true; tr.appendChild(td); return; }
      col.cell(i, td);
      tr.appendChild(td);
    });
    if (spec.onRow) tr.addEventListener("click", function (e) {
      if (e.target.closest("a, button")) return;  // links and buttons do their own thing
      spec.onRow(i);
    });
    return tr;
  };

  global.CbsiteTable = Table;
})(window);
