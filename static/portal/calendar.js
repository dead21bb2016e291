// Calendar: a click on a free part of a device row opens Book for that hour (4 hours, UTC).
(function () {
  "use strict";
  var HOUR = 3600 * 1000;
  document.addEventListener("click", function (event) {
    var track = event.target.closest("[data-book-track]");
    if (!track || event.target.closest(".tl-bar")) return;
    var timeline = track.closest(".timeline");
    var since = new Date(timeline.dataset.since).getTime();
    var box = track.getBoundingClientRect();
    var fraction = (event.clientX - box.left) / box.width;
    var start = Math.floor((since + fraction * 7 * 24 * HOUR) / HOUR) * HOUR;
    var nextHour = Math.ceil(Date.now() / HOUR) * HOUR;
    if (start < nextHour) start = nextHour;
    var row = track.closest(".tl-row");
    var params = new URLSearchParams({
      start: new Date(start).toISOString().slice(0, 16),
      end: new Date(start + 4 * HOUR).toISOString().slice(0, 16),
      gpu_model: row.dataset.model
    });
    if (row.dataset.kind === "mig") params.set("mig_profile", row.dataset.profile);
    event.preventDefault();
    location.href = "/book/?" + params.toString();
  });
})();
