/* Site-wide behaviour, on every page (extra_javascript):
   - search results carry the query (?find=), so a run page opens the component whose path (or a part of it)
     was searched for (runpage.js); Material's own ?h= holds the matched terms, not the path they came from, and
     its ?q= would open the search box again over the page it lands on;
   - a page opened from disk (file://) says why navigation, search, tables and charts do not work there. */
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var a = e.target && e.target.closest ? e.target.closest("a.md-search-result__link") : null;
    var input = document.querySelector(".md-search__input");
    var q = input && input.value ? input.value.trim() : "";
    if (!a || !q) return;
    var url = new URL(a.getAttribute("href"), location.href);
    url.searchParams.set("find", q);
    a.setAttribute("href", url.pathname + url.search + url.hash);
  }, true);

  function fileBanner() {
    if (location.protocol !== "file:" || document.querySelector(".cbsite-file-banner")) return;
    var div = document.createElement("div");
    div.className = "cbsite-file-banner";
    div.setAttribute("role", "alert");
    div.textContent = "This page was opened from disk (file://). Browsers do not let such pages load their data, " +
      "so the tables, icicles, charts, search and folder links do not work. Serve the site over HTTP instead: " +
      "cbsite serve SITE_FOLDER, then open http://127.0.0.1:8000/";
    document.body.insertBefore(div, document.body.firstChild);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fileBanner); else fileBanner();
})();
