// Keeps the page current without reloading it: every few seconds, each element with a
// data-live URL gets that URL's HTML (the same fragment the server rendered it with).
// While the database is away (503) the server sends its last data, greyed, under one
// banner, and the corner says so. A fetch that fails (the dashboard itself is gone) leaves
// the last content, greyed, and says so; a 404 (the job was deleted)
// or 401 (the credentials went stale) reloads the page so the server can say why. An
// element whose form someone is typing in (a queue's limits) is left alone until they
// submit it or empty it, so a refresh never wipes what they typed.
(function () {
  "use strict";
  const period = Number(document.body.dataset.refreshMs) || 2000;
  const status = document.getElementById("live-status");

  function say(text, stale) {
    status.textContent = text;
    status.classList.toggle("stale", stale);
  }

  function editing(el) {
    const fields = Array.from(el.querySelectorAll("input:not([type=hidden])"));
    return fields.some((f) => f === document.activeElement || f.value !== f.defaultValue);
  }

  async function refresh(el) {
    if (editing(el)) {
      el.dataset.held = "true";
      return;
    }
    delete el.dataset.held;
    const response = await fetch(el.dataset.live, {cache: "no-store", credentials: "same-origin"});
    if (response.status === 404 || response.status === 401) {
      window.location.reload();
      return;
    }
    el.innerHTML = await response.text();
    el.classList.remove("stale");
    el.dataset.refreshed = String(Number(el.dataset.refreshed || 0) + 1);
    return response.status === 503;
  }

  async function tick() {
    const live = Array.from(document.querySelectorAll("[data-live]"));
    try {
      const away = (await Promise.all(live.map(refresh))).some(Boolean);
      const held = document.querySelector("[data-live][data-held]");
      const time = new Date().toLocaleTimeString();
      if (away) {
        say("database unavailable · retrying · " + time, true);
      } else {
        say((held ? "held while you edit a form · " : "live · ") + time, false);
      }
    } catch (err) {
      live.forEach((el) => el.classList.add("stale"));
      say("dashboard unreachable; retrying", true);
    }
    window.setTimeout(tick, period);
  }

  window.setTimeout(tick, period);
})();
