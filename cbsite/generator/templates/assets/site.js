/* Site-wide behaviour, on every page (extra_javascript):
   - search results carry the query (?find=), so a run page opens the component whose path (or a part of it)
     was searched for (runlinks.js), a component's own result that component; Material's own ?h= holds the
     matched terms, not the path they came from, and its ?q= would open the search box again over the page;
   - a page opened from disk (file://) says why navigation, search, tables and charts do not work there;
   - the first Tab stop is a "Skip to content" link (Material draws one only on pages with a table of contents,
     and a run page's icicle and table are hundreds of stops after the header). */
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var a = e.target && e.target.closest ? e.target.closest("a.md-search-result__link") : null;
    var input = document.querySelector(".md-search__input");
    var q = input && input.value ? input.value.trim() : "";
    if (!a || !q) return;
    var url = new URL(a.getAttribute("href"), location.href);
    url.searchParams.set("find", q);
    // A component's own entry (run.md.j2: a heading whose id is find=PATH) opens that component.
    if (url.hash.indexOf("#find=") === 0) url.hash = "#component=" + url.hash.slice("#find=".length);
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
  function skipLink() {
    var content = document.querySelector(".md-content");
    if (!content || document.querySelector("a.md-skip")) return;
    if (!content.id) content.id = "cbsite-content";
    content.setAttribute("tabindex", "-1");  // focusable as the link's target, not a Tab stop
    var a = document.createElement("a");
    a.className = "md-skip cbsite-skip";
    a.href = "#" + content.id;
    a.textContent = "Skip to content";
    a.addEventListener("click", function (e) { e.preventDefault(); content.focus(); content.scrollIntoView(); });
    document.body.insertBefore(a, document.body.firstChild);
  }
  function ready() { fileBanner(); skipLink(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready); else ready();
})();
