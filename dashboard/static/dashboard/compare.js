// The job list's Compare button: the ticked jobs open /compare/?jobs=a,b,... (the page's shareable address).
// The list swaps in fresh rows every few seconds, so the ticks live here and are put back after each swap.
// Without this script the form still works: ?jobs=a&jobs=b, which the compare page redirects to its own form.
"use strict";
(function () {
  function init() {
    const form = document.getElementById("compare-form");
    const table = document.getElementById("jobs");
    if (!form || !table) return;
    const picked = new Set();
    const button = document.getElementById("compare-jobs");
    const count = document.getElementById("compare-count");

    function refresh() {
      table.querySelectorAll("input.pick-job").forEach((box) => { box.checked = picked.has(box.value); });
      if (button) button.disabled = picked.size < 2;
      if (count) count.textContent = picked.size ? picked.size + " ticked" : "";
    }

    table.querySelectorAll("input.pick-job:checked").forEach((box) => picked.add(box.value));  // back/forward
    table.addEventListener("change", (event) => {
      const box = event.target;
      if (!box.classList || !box.classList.contains("pick-job")) return;
      if (box.checked) picked.add(box.value); else picked.delete(box.value);
      refresh();
    });
    new MutationObserver(refresh).observe(table, {childList: true});  // a swapped <tbody>
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (picked.size < 2) return;
      window.location.href = form.action + "?jobs=" + Array.from(picked).map(encodeURIComponent).join(",");
    });
    refresh();
  }

  document.addEventListener("DOMContentLoaded", init);
})();
