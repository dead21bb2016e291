// A batch booking's output on its page: live.js forwards "booking.output" messages (the tail of
// what the running command printed); show the newest and keep the view at the bottom unless the
// reader scrolled up to read something.
(function () {
  "use strict";

  function atBottom(pre) {
    return pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
  }

  function toBottom() {
    var pre = document.getElementById("booking-output");
    if (pre) pre.scrollTop = pre.scrollHeight;
  }

  document.addEventListener("portal:live", function (event) {
    var message = event.detail;
    var pre = document.getElementById("booking-output");
    if (!pre || message.type !== "booking.output" || String(message.booking_id) !== pre.dataset.booking) return;
    var follow = pre.hidden || atBottom(pre);
    pre.textContent = message.log_tail;
    pre.hidden = false;
    var empty = document.getElementById("output-empty");
    if (empty) empty.hidden = true;
    if (follow) toBottom();
  });

  // The final output arrives with the booking's end, as a re-fetched fragment.
  document.addEventListener("portal:fragment", function (event) {
    if (event.detail === "output") toBottom();
  });
  toBottom();
})();
