// Strata dashboard helpers: plotly figures embedded as JSON, polling without full page reloads, CSRF.
"use strict";
window.Strata = (function () {
  const PLOT_CONFIG = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"]};

  function csrf() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  // Draw (or redraw in place) a plotly figure {data, layout} into the element with this id.
  function draw(id, figure) {
    const el = document.getElementById(id);
    if (!el || !window.Plotly || !figure) return;
    const layout = Object.assign({margin: {l: 50, r: 20, t: 30, b: 40}, autosize: true}, figure.layout || {});
    window.Plotly.react(el, figure.data || [], layout, PLOT_CONFIG);
    el.dataset.points = String((figure.data || []).reduce(
      (n, trace) => n + ((trace.y || trace.z || []).length || 0), 0));
  }

  // Every <div data-figure="script-id"> is drawn from the JSON in <script type="application/json" id="script-id">.
  function drawEmbedded(root) {
    (root || document).querySelectorAll("[data-figure]").forEach((el) => {
      const source = document.getElementById(el.dataset.figure);
      if (source) draw(el.id, JSON.parse(source.textContent));
    });
  }

  // Call fetch(url) every `ms` and hand the JSON (or text) to onData; stop when onData returns false.
  // Errors back off to 4x the interval and are shown in #live-status, never silently swallowed.
  function poll(url, ms, onData, options) {
    const opts = Object.assign({as: "json"}, options || {});
    let stopped = false;
    const status = document.getElementById("live-status");
    async function tick() {
      if (stopped) return;
      let delay = ms;
      try {
        const target = typeof url === "function" ? url() : url;
        const response = await fetch(target, {headers: {"Accept": opts.as === "json" ? "application/json" : "text/html"},
                                              credentials: "same-origin"});
        if (response.status === 401 || response.status === 403) { window.location.reload(); return; }
        if (!response.ok) throw new Error(response.status + " " + response.statusText);
        const body = opts.as === "json" ? await response.json() : await response.text();
        if (status) { status.textContent = "live"; status.className = "live ok"; }
        if (onData(body) === false) { stopped = true; if (status) status.textContent = "final"; return; }
      } catch (error) {
        delay = ms * 4;
        if (status) { status.textContent = "reconnecting: " + error.message; status.className = "live error"; }
      }
      setTimeout(tick, delay);
    }
    setTimeout(tick, opts.immediate ? 0 : ms);
    return {stop() { stopped = true; }};
  }

  async function postJSON(url, body) {
    const response = await fetch(url, {method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrf(), "Accept": "application/json"},
      body: JSON.stringify(body)});
    let data = null;
    try { data = await response.json(); } catch (error) { data = null; }
    return {status: response.status, ok: response.ok, data};
  }

  function escapeHTML(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }

  document.addEventListener("DOMContentLoaded", () => drawEmbedded(document));
  return {csrf, draw, drawEmbedded, poll, postJSON, escapeHTML};
})();
