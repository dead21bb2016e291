// Draws the figures the server built (json next to each .plot) with the portal's own plotly.js,
// in the current theme's colours.
(function () {
  "use strict";
  if (!window.Plotly) return;
  // Colours are light-dark() pairs; a probe element resolves them to the current theme's value.
  function resolve(name) {
    var probe = document.createElement("span");
    probe.style.color = "var(" + name + ")";
    document.body.appendChild(probe);
    var value = getComputedStyle(probe).color;
    probe.remove();
    return value;
  }
  function colours() {
    return { text: resolve("--text"), grid: resolve("--border"), accent: resolve("--accent") };
  }
  function themed(layout) {
    var c = colours();
    layout.paper_bgcolor = "rgba(0,0,0,0)";
    layout.plot_bgcolor = "rgba(0,0,0,0)";
    layout.font = { color: c.text, family: "system-ui, sans-serif", size: 12 };
    layout.colorway = [c.accent, "#d9822b", "#17a673", "#a35fd6", "#d94f4f", "#2fa4b8", "#8a8f2b", "#c24f9b"];
    ["xaxis", "yaxis"].forEach(function (axis) {
      layout[axis] = Object.assign({}, layout[axis], { gridcolor: c.grid, linecolor: c.grid, zerolinecolor: c.grid });
    });
    return layout;
  }
  var plots = [];
  document.querySelectorAll(".plot").forEach(function (el) {
    var script = el.nextElementSibling;
    if (!script || script.type !== "application/json") return;
    var figure = JSON.parse(script.textContent);
    Plotly.newPlot(el, figure.data, themed(figure.layout), {
      displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"]
    });
    plots.push([el, figure]);
    el.on("plotly_relayout", zoomed);
  });
  // Zooming into a chart offers the same range as a page of its own, at finer resolution.
  function zoomed(event) {
    var link = document.querySelector("[data-zoom-link]");
    var from = event["xaxis.range[0]"], to = event["xaxis.range[1]"];
    if (!link || from === undefined || to === undefined) return;
    var params = new URLSearchParams(window.location.search);
    params.set("range", "custom");
    params.set("from", String(from).replace(" ", "T").slice(0, 19));
    params.set("to", String(to).replace(" ", "T").slice(0, 19));
    link.href = "?" + params.toString();
    link.hidden = false;
  }
  document.addEventListener("portal:themechange", function () {
    plots.forEach(function (p) { Plotly.relayout(p[0], themed(p[1].layout)); });
  });
})();
