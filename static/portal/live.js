// Live updates over one websocket (/ws/live/). Telemetry updates cells in place; booking and
// queue changes re-fetch the page's fragments (elements with data-fragment). After a drop it
// reconnects with backoff and re-fetches everything, so nothing missed stays stale.
(function () {
  "use strict";
  var body = document.body;
  var path = body.dataset.liveUrl;
  var status = document.getElementById("live-status");
  var attempt = 0;
  var opened = false;
  var refetchTimer = null;
  var socket = null;

  function setStatus(state, text) {
    body.dataset.liveState = state;
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  // The portal closes with 4401 when the session is gone (signed out, expired): reconnecting
  // cannot help, so say so and offer the sign-in page, coming back here afterwards.
  function signedOut() {
    body.dataset.liveState = "signed-out";
    if (!status) return;
    status.dataset.state = "closed";
    status.textContent = "Signed out — ";
    var link = document.createElement("a");
    link.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname + location.search);
    link.textContent = "sign in again";
    status.appendChild(link);
  }

  function format(key, r) {
    var v = r[key];
    if (key === "utilization_gpu") return v === null || v === undefined ? "not measured" : Math.round(v) + " %";
    if (v === null || v === undefined) return "—";
    if (key === "memory_used_mib") {
      var used = (v / 1024).toFixed(1);
      return r.memory_total_mib ? used + " / " + Math.round(r.memory_total_mib / 1024) + " GiB" : used + " GiB";
    }
    if (key === "temperature_c") return Math.round(v) + " °C";
    if (key === "power_w") return Math.round(v) + " W";
    return String(v);
  }

  // A device shown "free" that now runs processes is "in use, unbooked" (and the other way
  // round): the server decides the state, so re-fetch the fragments that show it.
  function stateChanged(reading, uuid) {
    var busy = (reading.processes || []).length > 0;
    var stale = false;
    document.querySelectorAll('[data-state-of="' + uuid + '"]').forEach(function (shown) {
      if ((shown.dataset.state === "free" && busy) || (shown.dataset.state === "unbooked" && !busy)) stale = true;
    });
    return stale;
  }

  function showReading(reading) {
    var uuid = window.CSS && CSS.escape ? CSS.escape(reading.uuid) : reading.uuid;
    if (stateChanged(reading, uuid)) refetchAll();
    var selector = '[data-uuid="' + uuid + '"]';
    document.querySelectorAll(selector).forEach(function (holder) {
      holder.querySelectorAll("[data-metric]").forEach(function (cell) {
        var text = format(cell.dataset.metric, reading);
        if (cell.textContent !== text) cell.textContent = text;
      });
      var meter = holder.querySelector("[data-meter]");
      if (meter) {
        var u = reading.utilization_gpu;
        var unmeasured = u === null || u === undefined;
        meter.style.width = unmeasured ? "0" : Math.max(0, Math.min(100, u)) + "%";
        meter.parentElement.classList.toggle("unmeasured", unmeasured);
      }
    });
  }

  function fragmentUrl(name) {
    var params = new URLSearchParams(location.search);
    params.set("fragment", name);
    return location.pathname + "?" + params.toString();
  }

  function refetch(holder) {
    if (holder.contains(document.activeElement) && document.activeElement !== document.body) {
      // Do not pull a control away from under the user's fingers; try again shortly.
      setTimeout(function () { refetch(holder); }, 2000);
      return;
    }
    fetch(fragmentUrl(holder.dataset.fragment), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok || response.redirected) throw new Error("fragment " + response.status);
        return response.text();
      })
      .then(function (html) {
        holder.innerHTML = html;
        document.dispatchEvent(new CustomEvent("portal:fragment", { detail: holder.dataset.fragment }));
      })
      .catch(function () { /* the next change or reconnect fetches again */ });
  }

  function refetchAll() {
    clearTimeout(refetchTimer);
    refetchTimer = setTimeout(function () {
      document.querySelectorAll("[data-fragment]").forEach(refetch);
    }, 250);
  }

  function handle(message) {
    if (message.type === "telemetry.readings") {
      (message.readings || []).forEach(showReading);
    } else if (message.type === "booking.changed" || message.type === "queue.changed") {
      refetchAll();
    }
    document.dispatchEvent(new CustomEvent("portal:live", { detail: message }));
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + path);
    socket.onopen = function () {
      var caughtUp = opened;
      opened = true;
      attempt = 0;
      setStatus("open", "Live");
      if (caughtUp) refetchAll();
    };
    socket.onmessage = function (event) {
      try { handle(JSON.parse(event.data)); } catch (e) { /* ignore a malformed message */ }
    };
    socket.onclose = function (event) {
      if (event.code === 4401) { signedOut(); return; }
      var delay = Math.min(30000, 500 * Math.pow(2, attempt)) * (0.5 + Math.random() / 2);
      attempt += 1;
      setStatus("connecting", "Reconnecting…");
      setTimeout(connect, delay);
    };
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });

  // For tests and the curious: drop the line to see the page reconnect and catch up.
  window.portalLive = { drop: function () { if (socket) socket.close(); } };
  if (path && "WebSocket" in window) connect();
})();
