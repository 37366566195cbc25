/* Search results carry the query (?q=): a run page opens the component whose full path was searched for
   (runpage.js), since Material's own ?h= holds the matched terms, not the path they came from. */
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var a = e.target && e.target.closest ? e.target.closest("a.md-search-result__link") : null;
    var input = document.querySelector(".md-search__input");
    var q = input && input.value ? input.value.trim() : "";
    if (!a || !q) return;
    var url = new URL(a.getAttribute("href"), location.href);
    url.searchParams.set("q", q);
    a.setAttribute("href", url.pathname + url.search + url.hash);
  }, true);
})();
