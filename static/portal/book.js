// The Book form: show only the fields that apply, and preview the earliest start as you type.
(function () {
  "use strict";
  var form = document.getElementById("book-form");
  if (!form) return;
  var out = document.getElementById("estimate");
  var timer = null;
  var seq = 0;
  var busyRetries = 0;
  var MAX_BUSY_RETRIES = 5;

  function value(name) {
    var checked = form.querySelector('[name="' + name + '"]:checked');
    if (checked) return checked.value;
    var el = form.elements[name];
    if (!el) return "";
    if (el.type === "checkbox") return el.checked;
    return el.value;
  }

  function toggle() {
    form.querySelectorAll("[data-show-when]").forEach(function (el) {
      var rule = el.dataset.showWhen.split("=");
      el.hidden = value(rule[0]) !== rule[1];
    });
  }

  function payload() {
    var body = { qos: value("qos"), preemptible: !!value("preemptible") };
    if (value("project")) body.project = value("project");
    if (value("gpu_model")) body.gpu_model = value("gpu_model");
    if (value("mixed_models") && value("kind") === "gpus") body.mixed_models = true;
    if (value("command")) body.command = value("command");
    if (value("image")) body.image = value("image");
    if (value("kind") === "mig") {
      if (!value("mig_profile")) return null;
      body.mig_profile = value("mig_profile");
    } else if (value("kind") === "shared") {
      var share = parseFloat(value("gpu_fraction"));
      var gib = parseFloat(value("gpu_memory_gib"));
      if (!share && !gib) return null;
      if (share) body.gpu_fraction = share;
      if (gib) body.gpu_memory_mib = Math.round(gib * 1024);
    } else {
      var gpus = parseInt(value("gpus"), 10);
      if (!gpus) return null;
      body.gpus = gpus;
    }
    if (value("when") === "window") {
      if (!value("start") || !value("end")) return null;
      body.start = value("start").trim().replace(" ", "T") + ":00Z";
      body.end = value("end").trim().replace(" ", "T") + ":00Z";
    } else {
      var hours = parseFloat(value("duration_hours"));
      if (!hours) return null;
      body.duration_s = Math.round(hours * 3600);
      if (value("array")) body.array = value("array");
      if (value("after")) body.after = value("after");
    }
    return body;
  }

  function when(iso) {
    var date = new Date(iso);
    // As the pages show dates (the when filter): 2026-12-03 08:05 UTC.
    var text = date.toISOString().slice(0, 16).replace("T", " ") + " UTC";
    var minutes = Math.round((date - Date.now()) / 60000);
    if (minutes <= 1) return "now (" + text + ")";
    if (minutes < 120) return text + " (in " + minutes + " min)";
    return text + " (in " + Math.round(minutes / 60) + " h)";
  }

  function field(ms) {
    // As the form's start and end take it: "YYYY-MM-DD HH:MM" in UTC.
    return new Date(ms).toISOString().slice(0, 16).replace("T", " ");
  }

  function show(html, state) {
    out.dataset.state = state;
    out.innerHTML = html;
  }

  function escape(text) {
    var span = document.createElement("span");
    span.textContent = text || "";
    return span.innerHTML;
  }

  function estimate(retrying) {
    var body = payload();
    if (!body) { show('<span class="muted">Earliest start: fill in the form to see an estimate.</span>', "idle"); return; }
    if (!retrying) busyRetries = 0;
    var mine = ++seq;
    if (!retrying) show('<span class="muted">Estimating the earliest start…</span>', "loading");
    fetch(form.dataset.estimateUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": form.elements.csrfmiddlewaretoken.value },
      body: JSON.stringify(body)
    }).then(function (response) {
      if (mine !== seq) return;
      // Busy (503) or rate-limited (429): ask again after Retry-After, a few times.
      if ((response.status === 503 || response.status === 429) && busyRetries < MAX_BUSY_RETRIES) {
        busyRetries++;
        var wait = Math.min(10, Math.max(1, parseFloat(response.headers.get("Retry-After")) || 1));
        show('<span class="muted">The portal is busy; estimating again in ' + wait + " s…</span>", "busy");
        clearTimeout(timer);
        timer = setTimeout(function () { estimate(true); }, wait * 1000);
        return;
      }
      if (response.status === 404 || response.status === 405 || response.status >= 500) { show('<span class="muted">Estimate unavailable.</span>', "unavailable"); return; }
      return response.json().then(function (data) {
        if (mine !== seq) return;
        if (response.ok && data.planned_start) {
          show("Earliest start: <strong>" + escape(when(data.planned_start)) + "</strong>" +
            (data.state_detail ? ' <span class="muted">' + escape(data.state_detail) + "</span>" : ""), "ok");
        } else if (response.ok && data.next_window) {
          // The window does not fit: offer the next one of the same length that does.
          show("Cannot start as asked: " + escape(data.state_detail) +
            ' Next free window of the same length: <strong id="next-window">' +
            escape(when(data.next_window.start)) + "</strong> " +
            '<button type="button" id="use-next-window">Use it</button>', "next");
          document.getElementById("use-next-window").addEventListener("click", function () {
            // The form takes minutes: the window moves to the next whole minute, as long.
            var start = Math.ceil(Date.parse(data.next_window.start) / 60000) * 60000;
            var length = Date.parse(data.next_window.end) - Date.parse(data.next_window.start);
            form.elements.start.value = field(start);
            form.elements.end.value = field(start + length);
            later();
          });
        } else if (response.ok) {
          show("No start found yet. " + escape(data.state_detail || data.pending_reason), "none");
        } else if (data.error) {
          show("Cannot start as asked: " + escape(data.error.message), "error");
        } else {
          show('<span class="muted">Estimate unavailable.</span>', "unavailable");
        }
      });
    }).catch(function () {
      if (mine === seq) show('<span class="muted">Estimate unavailable.</span>', "unavailable");
    });
  }

  function later() { toggle(); clearTimeout(timer); timer = setTimeout(function () { estimate(false); }, 400); }
  form.addEventListener("input", later);
  form.addEventListener("change", later);
  toggle();
  estimate(false);
  var firstError = form.querySelector('[aria-invalid="true"]');
  if (firstError) firstError.focus();
})();
