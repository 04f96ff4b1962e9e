// Say so when an htmx request fails. htmx swaps refusals the server renders (400, 409, 422,
// 429: see the htmx-config in base.html); anything else (403, 404, a server error, no
// network) would otherwise change nothing on the page, and a person would act on a page
// that no longer tells the truth.
(function () {
  "use strict";

  var MESSAGES = {
    403: "You may not do that here any more: your role, your sign-in or the tenant you are " +
      "working in changed.",
    404: "What this page shows is gone or not yours to see: it was removed, or you switched " +
      "tenant in another tab.",
    405: "That cannot be done this way.",
    413: "That is too large to send.",
  };

  function box() {
    return document.getElementById("request-error");
  }

  function show(text) {
    var element = box();
    if (!element) {
      return;
    }
    element.querySelector("[data-request-error-text]").textContent = text;
    element.hidden = false;
  }

  function polls(element) {
    return /\bevery\b/.test(element.getAttribute("hx-trigger") || "");
  }

  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    // A poll the server refuses for good (signed out, role gone, row gone) stops asking.
    if (status >= 400 && status < 500 && polls(event.detail.elt)) {
      event.detail.elt.setAttribute("data-poll-refused", String(status));
    }
    var text = MESSAGES[status] ||
      (status >= 500
        ? "The server failed to answer (error " + status + "). Nothing was changed by this " +
          "request; try again, and tell your administrator if it keeps happening."
        : "The request was refused (status " + status + ").");
    show(text + " Reload the page to see where things stand.");
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.detail.elt.hasAttribute("data-poll-refused")) {
      event.preventDefault();
    }
  });

  document.addEventListener("htmx:sendError", function () {
    show("The server could not be reached. Check the connection, then reload the page.");
  });

  document.addEventListener("click", function (event) {
    if (event.target.closest("[data-request-error-dismiss]")) {
      box().hidden = true;
    }
  });
})();
