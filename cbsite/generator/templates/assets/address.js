/* A page's state in its address, the run page's and the diff page's alike: "#key=value&key=value" over the keys a
   page names ("#component=over_arch&rank=1&phase=backward", "#phase=backward&zoom=top"). A link with them opens the
   page so; a change is written with history.replaceState (no scroll, no history entry). A plain anchor ("#warnings",
   "#latency") is no state: it is read as none, and it stays while there is no state to write over it. */
(function (global) {
  "use strict";

  function Address(keys) { this.keys = keys; }

  /* The state the address holds: key -> decoded value, for this page's keys only. */
  Address.prototype.read = function () {
    var keys = this.keys, out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var eq = part.indexOf("=");
      if (eq <= 0 || keys.indexOf(part.slice(0, eq)) < 0) return;
      try { out[part.slice(0, eq)] = decodeURIComponent(part.slice(eq + 1)); } catch (e) { /* a malformed value */ }
    });
    return out;
  };

  /* The address with `changes` (key -> value, null to drop) over the state it holds, in the keys' order. */
  Address.prototype.write = function (changes) {
    var held = this.read(), now = {};
    Object.keys(held).forEach(function (k) { now[k] = held[k]; });
    Object.keys(changes).forEach(function (k) { if (changes[k] === null || changes[k] === undefined) delete now[k]; else now[k] = changes[k]; });
    var hash = this.keys.filter(function (k) { return k in now; }).map(function (k) { return k + "=" + encodeURIComponent(now[k]); }).join("&");
    if ((hash ? "#" + hash : "") === location.hash || !history.replaceState) return;
    if (!hash && location.hash && !Object.keys(held).length) return;  // a plain anchor stays
    history.replaceState(history.state, "", hash ? "#" + hash : location.pathname + location.search);
  };

  /* A selector set to `value` as a person would (its change event fired), where it offers that value. */
  Address.choose = function (sel, value) {
    if (!sel || value === undefined || sel.value === value) return;
    if (!Array.prototype.some.call(sel.options, function (o) { return o.value === value; })) return;
    sel.value = value;
    sel.dispatchEvent(new Event("change"));
  };

  global.CbsiteAddress = Address;
})(window);
