/* "Open in Perfetto": hand a trace from this site to the Perfetto UI with its postMessage handshake,
   so the trace never has to be public. The window must be opened inside the click handler (popup
   blockers), then we post 'PING' until the UI answers 'PONG' and post the trace as an ArrayBuffer. */
(function (global) {
  "use strict";

  function openInPerfetto(origin, traceUrl, title) {
    var win = global.open(origin + "/#!/", "_blank");
    if (!win) { global.alert("The Perfetto window was blocked; allow pop-ups for this site."); return null; }
    var fileName = traceUrl.split("/").pop();
    var buffer = null, ponged = false, done = false, tries = 0;
    var timer = null;

    function send() {
      if (done || !ponged || !buffer) return;
      done = true;
      win.postMessage({ perfetto: { buffer: buffer, title: title, fileName: fileName, url: global.location.href } }, origin);
    }
    function onMessage(evt) {
      if (evt.source !== win || evt.data !== "PONG") return;
      ponged = true;
      global.clearInterval(timer);
      global.removeEventListener("message", onMessage);
      send();
    }
    global.addEventListener("message", onMessage);
    // The UI needs a moment to load; PING every 50 ms for up to a minute. No answer within `answerMs`
    // (offline, a blocked origin): say so on this page, with the trace to download instead.
    var started = Date.now(), warned = false;
    timer = global.setInterval(function () {
      if (!warned && !ponged && Date.now() - started > api.answerMs) {
        warned = true;
        toast("The Perfetto UI at " + origin + " has not answered: it needs network access to that address " +
              "(or a self-hosted UI: cbsite build --perfetto-origin). Download the trace instead and open it in any Perfetto UI: ",
              traceUrl, fileName);
      }
      if (++tries > 1200 || win.closed) { global.clearInterval(timer); global.removeEventListener("message", onMessage); return; }
      win.postMessage("PING", origin);
    }, 50);
    fetch(traceUrl).then(function (r) {
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      return r.arrayBuffer();
    }).then(function (b) { buffer = b; send(); }).catch(function (err) {
      global.clearInterval(timer);
      global.alert("Could not load the trace " + traceUrl + ": " + err.message +
                   " (the site must be served over HTTP: cbsite serve)");
    });
    return win;
  }

  /* A message in the corner of this page (the Perfetto tab may show only a browser error). */
  function toast(text, href, linkText) {
    var old = global.document.querySelector(".cbsite-toast");
    if (old) old.remove();
    var div = global.document.createElement("div");
    div.className = "cbsite-toast";
    div.setAttribute("role", "alert");
    div.appendChild(global.document.createTextNode(text));
    if (href) {
      var a = global.document.createElement("a");
      a.href = href; a.textContent = linkText || href; a.setAttribute("download", "");
      div.appendChild(a);
    }
    var close = global.document.createElement("button");
    close.type = "button"; close.textContent = "close";
    close.addEventListener("click", function () { div.remove(); });
    div.appendChild(close);
    global.document.body.appendChild(div);
    return div;
  }

  var api = { open: openInPerfetto, toast: toast, answerMs: 8000 };
  global.CbsitePerfetto = api;
})(window);
