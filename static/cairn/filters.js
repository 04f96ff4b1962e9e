// On a narrow screen the runs page's filter form starts folded, so the status chips and the
// rows (with their Status) are the first thing seen. The form stays open when a filter could
// not be read (its error is next to the field) and on wide screens; without JavaScript it is
// simply open.
(function () {
  "use strict";

  function fold() {
    var box = document.getElementById("run-filters");
    if (!box || box.hasAttribute("data-keep-open")) {
      return;
    }
    if (window.matchMedia("(max-width: 700px)").matches) {
      box.open = false;
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", fold);
  } else {
    fold();
  }
})();
