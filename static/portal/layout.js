// Positions and widths come as data attributes (data-left, data-width, in percent) and are set
// here through the CSSOM: the pages carry no style attributes, which the site's
// Content-Security-Policy (no 'unsafe-inline') refuses. Fragments the live view swaps in too.
(function () {
  "use strict";
  function apply(root) {
    root.querySelectorAll("[data-left], [data-width]").forEach(function (el) {
      if (el.dataset.left !== undefined) el.style.left = el.dataset.left + "%";
      if (el.dataset.width !== undefined) el.style.width = el.dataset.width + "%";
    });
  }
  document.addEventListener("DOMContentLoaded", function () { apply(document); });
  document.addEventListener("portal:fragment", function () { apply(document); });
})();
