// Light / dark / automatic theme. Runs in <head> so the page never flashes the wrong colours.
(function () {
  "use strict";
  var KEY = "portal-theme";
  var ORDER = ["auto", "light", "dark"];
  var LABELS = { auto: "automatic", light: "light", dark: "dark" };
  var ICONS = { auto: "◐", light: "☀", dark: "☾" };

  function stored() {
    try { return localStorage.getItem(KEY) || "auto"; } catch (e) { return "auto"; }
  }
  function apply(theme) {
    if (theme === "auto") document.documentElement.removeAttribute("data-theme");
    else document.documentElement.setAttribute("data-theme", theme);
  }
  apply(stored());

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    function show(theme) {
      var next = ORDER[(ORDER.indexOf(theme) + 1) % ORDER.length];
      button.textContent = ICONS[theme];
      button.setAttribute("aria-label", "Colour theme: " + LABELS[theme] + ". Switch to " + LABELS[next]);
      button.title = "Theme: " + LABELS[theme];
    }
    show(stored());
    button.addEventListener("click", function () {
      var theme = ORDER[(ORDER.indexOf(stored()) + 1) % ORDER.length];
      try { localStorage.setItem(KEY, theme); } catch (e) { /* private mode: this page only */ }
      apply(theme);
      show(theme);
      document.dispatchEvent(new CustomEvent("portal:themechange"));
    });
  });
})();
