// Live updates over one websocket (/ws/live/). Telemetry updates cells in place; booking and
// queue changes re-fetch the page's fragments (elements with data-fragment; one with
// data-refetch-on="queue own" only for those reasons). The overview instead applies the small
// patches the portal sends (overview.patch): node counts, device states, the queue's size, and
// loads a node's devices when it is expanded. After a drop it reconnects with backoff and
// re-fetches everything, so nothing missed stays stale.
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

  function esc(value) {
    return window.CSS && CSS.escape ? CSS.escape(value) : String(value).replace(/["\\]/g, "\\$&");
  }

  // A device shown "free" that now runs processes is "in use, unbooked" (and the other way
  // round): the server decides the state, so re-fetch what shows it (on the overview, only
  // the node it is on).
  function stateChanged(reading, uuid) {
    var busy = (reading.processes || []).length > 0;
    var stale = false;
    document.querySelectorAll('[data-state-of="' + uuid + '"]').forEach(function (shown) {
      if ((shown.dataset.state === "free" && busy) || (shown.dataset.state === "unbooked" && !busy)) {
        var node = shown.closest("[data-node-devices]");
        if (node) loadNode(node); else stale = true;
      }
    });
    return stale;
  }

  function showReading(reading) {
    var uuid = esc(reading.uuid);
    if (stateChanged(reading, uuid)) refetchAll("state");
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
        // The overview's node list comes back collapsed: open again the nodes that were open.
        var reopen = [];
        holder.querySelectorAll("details[data-node][open]").forEach(function (d) { reopen.push(d.dataset.node); });
        holder.innerHTML = html;
        reopen.forEach(function (name) {
          var details = holder.querySelector('details[data-node="' + esc(name) + '"]');
          if (details && !details.open) details.open = true;
        });
        document.dispatchEvent(new CustomEvent("portal:fragment", { detail: holder.dataset.fragment }));
      })
      .catch(function () { /* the next change or reconnect fetches again */ });
  }

  // Re-fetch the fragments that a change of this kind affects ("booking", "queue", "own": a
  // booking of this user's, "state", "reconnect": all of them, expanded nodes too).
  var pendingReasons = {};
  function refetchAll(reason) {
    pendingReasons[reason || "reconnect"] = true;
    clearTimeout(refetchTimer);
    refetchTimer = setTimeout(function () {
      var reasons = pendingReasons;
      pendingReasons = {};
      document.querySelectorAll("[data-fragment]").forEach(function (holder) {
        var on = holder.dataset.refetchOn;
        var wanted = reasons.reconnect || on === undefined || on.split(" ").some(function (r) { return reasons[r]; });
        if (wanted) refetch(holder);
      });
      if (reasons.reconnect) document.querySelectorAll("details[open] > [data-node-devices]").forEach(loadNode);
    }, 250);
  }

  // The overview ------------------------------------------------------------------------------

  function nodeParams(holder) {
    var params = new URLSearchParams(location.search);
    params.set("fragment", "node");
    params.set("node", holder.dataset.nodeDevices);
    return location.pathname + "?" + params.toString();
  }

  function loadNode(holder) {
    fetch(nodeParams(holder), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok || response.redirected) throw new Error("node " + response.status);
        return response.text();
      })
      .then(function (html) {
        holder.innerHTML = html;
        holder.parentElement.dataset.loaded = "";
        var now = holder.querySelector("[data-node-now]");
        if (now) setNodeLine(now.dataset.nodeNow, JSON.parse(now.dataset.counts), now.dataset.state, +now.dataset.version, JSON.parse(now.dataset.resources || "null"));
        sumTotals();
        document.dispatchEvent(new CustomEvent("portal:node", { detail: holder.dataset.nodeDevices }));
      })
      .catch(function () { /* the next expand or reconnect loads it again */ });
  }

  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!details.matches || !details.matches("details[data-node]") || !details.open) return;
    if (details.dataset.loaded === undefined) loadNode(details.querySelector("[data-node-devices]"));
  }, true);

  function setText(root, selector, value) {
    root.querySelectorAll(selector).forEach(function (cell) {
      var text = String(value);
      if (cell.textContent !== text) cell.textContent = text;
    });
  }

  // A node line shows its counts summed over its models: [gpus, free, slices, free slices].
  // and, where the node reports them, [cores held, cores, memory MiB held, memory MiB].
  function setNodeLine(hostname, counts, state, version, resources) {
    var line = document.querySelector('[data-node-line="' + esc(hostname) + '"]');
    if (!line || +line.dataset.version > version) return;
    line.dataset.version = version;
    line.dataset.counts = JSON.stringify(counts);
    var sum = [0, 0, 0, 0];
    Object.keys(counts).forEach(function (model) { counts[model].forEach(function (n, i) { sum[i] += n; }); });
    var summary = line.querySelector("summary");
    setText(summary, '[data-count="gpus"]', sum[0]);
    setText(summary, '[data-count="free_gpus"]', sum[1]);
    setText(summary, '[data-count="slices"]', sum[2]);
    setText(summary, '[data-count="free_slices"]', sum[3]);
    var slices = summary.querySelector("[data-slices]");
    if (slices) slices.hidden = sum[2] === 0;
    var badge = summary.querySelector("[data-node-state]");
    if (badge) { badge.textContent = state; badge.hidden = state === "up"; }
    if (resources === undefined) return;
    var held = summary.querySelector("[data-resources]");
    if (held) held.hidden = !resources;
    // The line and, when expanded, its node's gauges (templates/portal/_node_resources.html).
    (resources || []).forEach(function (n, i) {
      line.querySelectorAll('[data-resource="' + i + '"]').forEach(function (cell) {
        var text = String(cell.dataset.gib !== undefined ? Math.round(n / 1024) : n);
        if (cell.textContent !== text) cell.textContent = text;
      });
      line.querySelectorAll('[data-resource-meter="' + i + '"]').forEach(function (meter) { meter.value = n; });
    });
  }

  // The totals and the model lines are the node lines summed (every node is listed, hidden
  // when a filter leaves it out).
  function sumTotals() {
    var lines = document.querySelectorAll("[data-node-line]");
    if (!lines.length) return;
    var all = [0, 0, 0, 0];
    var byModel = {};
    lines.forEach(function (line) {
      var counts = JSON.parse(line.dataset.counts || "{}");
      Object.keys(counts).forEach(function (model) {
        var sum = byModel[model] = byModel[model] || [0, 0, 0, 0];
        counts[model].forEach(function (n, i) { sum[i] += n; all[i] += n; });
      });
    });
    setText(document, '[data-total="gpus"]', all[0]);
    setText(document, '[data-total="free_gpus"]', all[1]);
    setText(document, '[data-total="slices"]', all[2]);
    setText(document, '[data-total="free_slices"]', all[3]);
    document.querySelectorAll("[data-total-slices]").forEach(function (el) { el.hidden = all[2] === 0; });
    Object.keys(byModel).forEach(function (model) {
      var row = document.querySelector('[data-model-line="' + esc(model) + '"]');
      if (!row) return;
      var sum = byModel[model];
      setText(row, '[data-count="gpus"]', sum[0]);
      setText(row, '[data-count="free_gpus"]', sum[1]);
      setText(row, '[data-count="slices"]', sum[2]);
      setText(row, '[data-count="free_slices"]', sum[3]);
    });
  }

  function gib(mib) { return (mib / 1024).toFixed(1) + " GiB"; }

  function bookingLink(booking) {
    var mine = String(booking.owner_id) === body.dataset.userId || body.dataset.staff !== undefined;
    var id = document.createElement(mine ? "a" : "span");
    if (mine) id.href = "/bookings/" + booking.id + "/";
    id.textContent = "#" + booking.id;
    return id;
  }

  // A shared GPU's tenants, as templates/portal/_tenants.html writes them (compact).
  function tenantsCell(cell, tenants, muted) {
    var list = document.createElement("ul");
    list.className = "plain tenants";
    tenants.forEach(function (t) {
      var item = document.createElement("li");
      item.dataset.tenant = t.id;
      item.appendChild(bookingLink(t));
      item.appendChild(document.createTextNode(" " + t.owner + " "));
      var share = t.percent;
      if (t.memory_mib !== null) share += " · " + (t.used_mib !== null ? gib(t.used_mib) + " of " : "") + gib(t.memory_mib);
      item.appendChild(muted(share));
      if (t.memory_mib !== null && t.used_mib !== null && t.used_mib > t.memory_mib) {
        var over = document.createElement("span");
        over.className = "badge state-unbooked";
        over.textContent = "over its memory share";
        item.appendChild(document.createTextNode(" "));
        item.appendChild(over);
      }
      list.appendChild(item);
    });
    cell.appendChild(list);
  }

  function bookingCell(cell, row, booking, tenants) {
    cell.textContent = "";
    var muted = function (text) { var s = document.createElement("span"); s.className = "muted"; s.textContent = text; return s; };
    if (tenants && tenants.length) {
      tenantsCell(cell, tenants, muted);
      return;
    }
    if (!booking) {
      cell.appendChild(muted(row.dataset.parent !== undefined ? "see slices" : "—"));
      return;
    }
    cell.appendChild(bookingLink(booking));
    cell.appendChild(document.createTextNode(" " + booking.owner + " "));
    cell.appendChild(muted("(" + booking.project + ")"));
  }

  function patchDevice(device, version) {
    document.querySelectorAll('[data-overview] tr[data-uuid="' + esc(device.uuid) + '"]').forEach(function (row) {
      if (+(row.dataset.version || 0) > version) return;
      row.dataset.version = version;
      row.dataset.state = device.state;
      var badge = row.querySelector(".badge");
      if (badge) {
        badge.className = "badge state-" + device.state.replace(/ /g, "");
        badge.textContent = device.state_label;
      }
      var cell = row.querySelector("[data-booking-cell]");
      if (cell) bookingCell(cell, row, device.booking, device.tenants);
      row.classList.remove("flash");
      void row.offsetWidth;
      row.classList.add("flash");
    });
  }

  function applyPatch(message) {
    var version = message.version || 0;
    (message.nodes || []).forEach(function (node) { setNodeLine(node.hostname, node.counts, node.state, version, node.resources); });
    (message.devices || []).forEach(function (device) { patchDevice(device, version); });
    var totals = document.querySelector('[data-fragment="totals"]');
    if (totals && +(totals.dataset.version || 0) <= version) {
      totals.dataset.version = version;
      setText(totals, '[data-total="queued"]', message.queued);
      setText(totals, '[data-total="queued_gpu_hours"]', Number(message.queued_gpu_hours).toFixed(1));
      setText(totals, '[data-plural="queued"]', message.queued === 1 ? "" : "s");
    }
    sumTotals();
    if (message.owner_id !== null && String(message.owner_id) === body.dataset.userId) refetchAll("own");
  }

  function handle(message) {
    if (message.type === "telemetry.readings") {
      (message.readings || []).forEach(showReading);
    } else if (message.type === "booking.changed") {
      refetchAll("booking");
    } else if (message.type === "queue.changed") {
      refetchAll("queue");
    } else if (message.type === "overview.patch") {
      if (document.querySelector("[data-overview]")) applyPatch(message);
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
      if (caughtUp) refetchAll("reconnect");
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
