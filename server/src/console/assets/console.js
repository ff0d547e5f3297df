// outboxd console: live refresh of the parts of a page marked data-refresh (paused while the
// tab is hidden), and the lag charts (uPlot) of elements marked data-chart. Nothing else: the
// pages work without it, and forms post as forms.
"use strict";

(function () {
  function refresh(el) {
    if (document.visibilityState !== "visible") return;
    fetch(el.dataset.refresh, { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
      .then(function (r) {
        if (r.redirected || r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== undefined) {
          // Server-rendered, escaped HTML of the same origin.
          el.innerHTML = html;
          draw(el);
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }

  function draw(root) {
    if (typeof uPlot === "undefined") return;
    root.querySelectorAll("[data-chart]").forEach(function (el) {
      var d;
      try { d = JSON.parse(el.dataset.chart); } catch (e) { return; }
      el.textContent = "";
      var width = Math.max(320, Math.min(900, el.clientWidth || 640));
      new uPlot({
        width: width,
        height: 200,
        series: [{}].concat(d.series.map(function (s, i) {
          return { label: s, stroke: ["#2563eb", "#dc2626", "#16a34a"][i % 3], width: 2, scale: i === 0 ? "n" : "s" };
        })),
        axes: [{}, { scale: "n" }, { scale: "s", side: 1, grid: { show: false } }],
        scales: { x: { time: true } }
      }, d.data, el);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.querySelectorAll("[data-refresh]");
    live.forEach(function (el) {
      var every = Math.max(2, parseInt(el.dataset.every || "5", 10)) * 1000;
      setInterval(function () { refresh(el); }, every);
    });
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") live.forEach(refresh);
    });
    draw(document);
  });
})();
