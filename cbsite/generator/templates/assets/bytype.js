/* The run page's "time by module type": choosing a type filters the component table to that type's components. */
(function () {
  "use strict";
  function pick(button) {
    var box = document.getElementById("cbsite-table"), table = box && box.cbsiteTable;
    if (!table) return;  // the table is drawn once components.json is in; until then a click does nothing
    var type = button.getAttribute("data-type");
    var chosen = table.only && table.only.value === type;
    table.showOnly("module_type", chosen ? null : type, button.textContent);
    Array.prototype.forEach.call(document.querySelectorAll(".cbsite-bytype-pick"), function (b) {
      b.setAttribute("aria-pressed", String(!chosen && b === button));
    });
    if (!chosen) box.scrollIntoView({ block: "start" });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest(".cbsite-bytype-pick");
    if (b) pick(b);
  });
})();
