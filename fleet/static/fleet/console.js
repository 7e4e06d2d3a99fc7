// The console's one script (templates/console/): refresh marked parts in place, fetch logs.
// No framework: each element with data-refresh-url is replaced by what that URL answers,
// every data-refresh-s seconds, while the page is visible.
(function () {
  "use strict";

  function load(el, url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (resp) {
        if (!resp.ok) { throw new Error(resp.status + " " + resp.statusText); }
        return resp.text();
      })
      .then(function (html) {
        el.innerHTML = html;
        el.classList.remove("stale");
        el.dataset.refreshedAt = new Date().toISOString();
        el.dispatchEvent(new CustomEvent("console:refreshed", { bubbles: true }));
      })
      .catch(function () { el.classList.add("stale"); });
  }

  function keepFresh(el) {
    var every = Math.max(1, parseInt(el.dataset.refreshS || "5", 10)) * 1000;
    function tick() {
      var next = function () { window.setTimeout(tick, every); };
      if (document.hidden) { next(); return; }
      load(el, el.dataset.refreshUrl).then(next, next);
    }
    if (el.hasAttribute("data-load-now")) { tick(); } else { window.setTimeout(tick, every); }
  }

  function logs(form) {
    var out = document.getElementById("node-logs-output");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var query = new URLSearchParams(new FormData(form)).toString();
      out.classList.add("stale");
      load(out, form.action + "?" + query);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh-url]").forEach(keepFresh);
    document.querySelectorAll("form.logs-form").forEach(logs);
  });
})();
