// The jobs pages: live list rows, the submit page (form, editor, CLI and curl snippets), and the job detail
// page's live logs, events, charts and panels. All user text goes into the page through textContent, or as
// HTML the server rendered with autoescaping.
"use strict";
(function () {
  function debounce(fn, ms) {
    let timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined && text !== null) el.textContent = String(text);
    return el;
  }

  // --- job list: swap in fresh rows every 2 s ---------------------------------------------------------------
  function initList() {
    const table = document.getElementById("jobs");
    if (!table) return;
    const filters = document.getElementById("job-filters");
    if (filters) {
      filters.querySelectorAll("select").forEach((select) => select.addEventListener("change", () => filters.submit()));
    }
    const range = document.getElementById("jobs-range");
    // Child jobs are listed under their parent, collapsed until its toggle opens them (kept across refreshes).
    const expanded = new Set();
    function showChildren() {
      const shown = {};
      Array.from(table.tBodies[0].rows).forEach((row) => {
        const parent = row.dataset.parentId;
        const visible = !parent || (shown[parent] && expanded.has(parent));
        shown[row.dataset.jobId] = visible;
        row.hidden = !visible;
        const toggle = row.querySelector(".toggle-children");
        if (toggle) {
          const open = expanded.has(toggle.dataset.toggle);
          toggle.setAttribute("aria-expanded", String(open));
          toggle.textContent = (open ? "▾ " : "▸ ") + toggle.textContent.replace(/^[▸▾]\s*/, "");
        }
      });
    }
    table.addEventListener("click", (event) => {
      const toggle = event.target.closest(".toggle-children");
      if (!toggle) return;
      const id = toggle.dataset.toggle;
      if (expanded.has(id)) expanded.delete(id); else expanded.add(id);
      showChildren();
    });
    let last = null;
    Strata.poll(() => table.dataset.rowsUrl + window.location.search, 2000, (html) => {
      if (html === last) return true;
      const template = document.createElement("template");
      template.innerHTML = html;
      const fresh = template.content.querySelector("tbody");
      if (!fresh) return true;
      last = html;
      table.tBodies[0].replaceWith(fresh);
      showChildren();
      if (range && fresh.dataset.range !== undefined) range.textContent = fresh.dataset.range;
      if (fresh.dataset.counts) {
        Object.entries(JSON.parse(fresh.dataset.counts)).forEach(([state, count]) => {
          const chip = document.querySelector('#state-counts [data-count-state="' + state + '"]');
          if (!chip) return;
          chip.querySelector(".n").textContent = count;
          chip.classList.toggle("zero", !count);
        });
      }
      return true;
    }, {as: "text"});
  }

  // --- submit: snippets follow the form or the editor; the editor validates and submits --------------------
  function initSubmit() {
    const form = document.getElementById("submit-form");
    if (!form) return;
    const validateUrl = form.dataset.validateUrl;
    const nonce = form.querySelector("input[name=nonce]").value;
    const editor = document.getElementById("spec-editor");
    const errorList = document.getElementById("editor-errors");
    const status = document.getElementById("editor-status");
    const cli = document.getElementById("cli-snippet");
    const curl = document.getElementById("curl-snippet");
    const submitButton = document.getElementById("submit-job");
    let sequence = 0;
    let formYaml = null;

    function showSnippets(data) {
      if (data.cli) cli.textContent = data.cli;
      if (data.curl) curl.textContent = data.curl;
    }

    async function validateForm() {
      const mine = ++sequence;
      try {
        const response = await fetch(validateUrl, {
          method: "POST", credentials: "same-origin",
          headers: {"X-CSRFToken": Strata.csrf(), "Accept": "application/json"},
          // The fields as text (a chosen archive is uploaded with the submit itself, not with each check).
          body: new URLSearchParams([...new FormData(form)].filter(([, value]) => typeof value === "string")),
        });
        if (!response.ok) return;
        const data = await response.json();
        formYaml = data.yaml;
        if (mine === sequence) showSnippets(data);
      } catch (error) {
        // The snippets are a convenience: the form still submits and shows the server's errors.
      }
    }

    function showErrors(errors) {
      errorList.replaceChildren();
      Object.entries(errors || {}).forEach(([field, message]) => {
        const item = element("li", "field-error");
        item.dataset.field = field;
        item.append(element("code", "", field), document.createTextNode(": " + message));
        errorList.append(item);
      });
      editor.classList.toggle("invalid", errorList.children.length > 0);
    }

    async function validateEditor(submit) {
      const mine = ++sequence;
      status.textContent = submit ? "Submitting…" : "Checking…";
      let result;
      try {
        result = await Strata.postJSON(validateUrl, {document: editor.value, submit: Boolean(submit), nonce});
      } catch (error) {
        status.textContent = "Could not reach the server: " + error.message;
        return;
      }
      const data = result.data;
      if (result.status === 401 || result.status === 403) {
        status.textContent = "Your session has ended: log in again (your text stays in this tab).";
        status.className = "bad";
        return;
      }
      if (result.status === 201 && data && data.redirect) {
        window.location.assign(data.redirect);
        return;
      }
      if (mine !== sequence && !submit) return;
      if (!data) {
        status.textContent = "The server answered " + result.status + ".";
        return;
      }
      showErrors(data.errors);
      const count = Object.keys(data.errors || {}).length;
      status.textContent = data.valid ? (submit ? "" : "Valid.") : (count === 1 ? "1 problem" : count + " problems");
      status.className = data.valid ? "ok" : "bad";
      showSnippets(data);
    }

    const firstError = form.querySelector(".has-error input, .has-error select, .has-error textarea");
    if (firstError) firstError.focus();

    const formChanged = debounce(validateForm, 350);
    form.addEventListener("input", formChanged);
    form.addEventListener("change", formChanged);
    form.addEventListener("submit", () => {
      // One click, one job: the button comes back if the browser restores this page from its cache.
      setTimeout(() => { submitButton.disabled = true; }, 0);
    });
    window.addEventListener("pageshow", () => { submitButton.disabled = false; });

    editor.addEventListener("input", debounce(() => validateEditor(false), 600));
    editor.addEventListener("keydown", (event) => {
      if (event.key === "Tab" && !event.shiftKey) {  // indent instead of leaving the editor
        event.preventDefault();
        const start = editor.selectionStart;
        editor.setRangeText("  ", start, editor.selectionEnd, "end");
      }
    });
    document.getElementById("validate-spec").addEventListener("click", () => validateEditor(false));
    document.getElementById("submit-editor").addEventListener("click", () => validateEditor(true));
    document.getElementById("form-to-editor").addEventListener("click", async () => {
      if (formYaml === null) await validateForm();
      if (formYaml) {
        editor.value = formYaml;
        validateEditor(false);
      }
    });
    document.querySelectorAll("button.copy").forEach((button) => {
      button.addEventListener("click", async () => {
        const source = document.getElementById(button.dataset.copy);
        try {
          await navigator.clipboard.writeText(source.textContent);
          button.textContent = "Copied";
        } catch (error) {
          window.getSelection().selectAllChildren(source);  // no clipboard over plain http: select it instead
          button.textContent = "Selected";
        }
        setTimeout(() => { button.textContent = "Copy"; }, 1500);
      });
    });
  }

  // --- job detail: poll the live endpoint until the job is terminal -----------------------------------------
  function initDetail() {
    const configElement = document.getElementById("job-live-config");
    if (!configElement) return;
    const config = JSON.parse(configElement.textContent);
    const cursors = Object.assign({}, config.cursors);
    const logs = document.getElementById("logs");
    const follow = document.getElementById("log-follow");
    const events = document.getElementById("events");
    const MAX_LOG_CHARS = 2000000;

    logs.scrollTop = logs.scrollHeight;
    events.scrollTop = events.scrollHeight;
    if (config.terminal) return;

    function ensureChart(chart) {
      const existing = document.getElementById("chart-" + chart);
      if (existing) return existing;
      const spec = config.charts.charts[chart];
      const section = element("section", "card chart-card");
      section.dataset.chart = chart;
      const plot = element("div", "chart");
      plot.id = "chart-" + chart;
      section.append(element("h2", "", spec.title), plot);
      const container = document.getElementById("charts");
      const order = config.charts.order;
      const before = Array.from(container.children).find(
        (child) => order.indexOf(child.dataset.chart) > order.indexOf(chart));
      container.insertBefore(section, before || null);
      const empty = document.getElementById("charts-empty");
      if (empty) empty.remove();
      Strata.draw(plot.id, {data: [], layout: spec.layout});
      // A new card changes the grid's columns: the charts already drawn take their new widths.
      document.querySelectorAll(".board .chart").forEach((other) => {
        if (other !== plot && other.data) window.Plotly.Plots.resize(other);
      });
      return plot;
    }

    // A metric whose points span fewer than two steps is shown as a value (the server's text), not as a line:
    // it becomes a line on its chart when a second step arrives.
    const valuesCard = document.getElementById("metric-values");
    const valuesList = document.getElementById("metric-values-list");

    function valueEntry(name) {
      return Array.from(valuesList.children).find((child) => child.dataset.metric === name) || null;
    }

    function showValue(name, points, text) {
      let entry = valueEntry(name);
      if (!entry) {
        entry = element("div", "contents");
        entry.dataset.metric = name;
        entry.append(element("dt", "", name), element("dd", "num"));
        valuesList.append(entry);
      }
      entry.dataset.points = JSON.stringify(points);
      const finite = points.x.filter((x, i) => points.y[i] !== null);
      const dd = entry.querySelector("dd");
      dd.replaceChildren(document.createTextNode(text));
      if (finite.length) dd.append(" ", element("span", "muted", "at step " + finite[finite.length - 1]));
      valuesCard.hidden = false;
      const empty = document.getElementById("charts-empty");
      if (empty) empty.remove();
    }

    function applyMetrics(metrics) {
      if (!window.Plotly) return;
      const palette = config.charts.palette;
      Object.entries(metrics || {}).forEach(([name, series]) => {
        const existing = document.getElementById("chart-" + series.chart);
        const drawn = existing && (existing.data || []).findIndex((trace) => trace.name === name);
        if (!existing || drawn < 0) {
          const entry = valueEntry(name);
          const known = entry ? JSON.parse(entry.dataset.points) : {x: [], y: []};
          const points = {x: known.x.concat(series.x), y: known.y.concat(series.y)};
          const steps = new Set(points.x.filter((x, i) => points.y[i] !== null));
          if (steps.size < 2) {
            showValue(name, points, series.text);
            return;
          }
          if (entry) entry.remove();
          valuesCard.hidden = valuesList.children.length === 0;
          series = Object.assign({}, series, points);
        }
        const plot = ensureChart(series.chart);
        const traces = plot.data || [];
        const index = traces.findIndex((trace) => trace.name === name);
        if (index >= 0) {
          window.Plotly.extendTraces(plot, {x: [series.x], y: [series.y]}, [index]);
        } else {
          window.Plotly.addTraces(plot, {type: "scatter", mode: "lines", name, x: series.x, y: series.y,
                                         line: {color: palette[traces.length % palette.length], width: 2}});
        }
        plot.dataset.points = String((plot.data || []).reduce((n, trace) => n + (trace.y || []).length, 0));
      });
    }

    function appendLogs(items) {
      if (!items || !items.length) return;
      logs.append(document.createTextNode(items.map((item) => item.text).join("\n") + "\n"));
      if (logs.textContent.length > MAX_LOG_CHARS) {
        const text = logs.textContent;
        const cut = text.indexOf("\n", text.length - MAX_LOG_CHARS * 0.8);
        logs.textContent = text.slice(cut + 1);
      }
      if (follow.checked) logs.scrollTop = logs.scrollHeight;
    }

    function appendEvents(items) {
      if (!items || !items.length) return;
      const atBottom = events.scrollHeight - events.scrollTop - events.clientHeight < 40;
      items.forEach((event) => {
        const item = element("li");
        item.dataset.eventId = event.id;
        item.dataset.kind = event.kind;
        const time = element("time", "", event.clock);
        time.setAttribute("datetime", event.time);
        item.append(time, " ", element("span", "event-kind", event.kind), " ",
                    element("span", "event-message", event.message));
        events.append(item);
      });
      if (atBottom) events.scrollTop = events.scrollHeight;
    }

    const fragments = {};
    function swap(selector, html) {
      if (html === undefined || fragments[selector] === html) return;
      const target = document.querySelector(selector);
      if (target) target.innerHTML = html;  // rendered (and escaped) by the server's templates
      fragments[selector] = html;
    }

    function renderPanel(body, panel, index) {
      if (panel.error) {
        const box = element("div", "panel-error", "This panel failed to render: ");
        box.setAttribute("role", "alert");
        box.append(element("code", "", panel.error));
        body.replaceChildren(box);
      } else if (panel.figure || panel.table) {
        // A figure, a table, or both (the table below the figure).
        const keep = [];
        if (panel.figure) {
          let plot = body.querySelector(".chart");
          if (!plot) {
            plot = element("div", "chart");
            plot.id = "panel-live-" + index + "-chart";
          }
          keep.push(plot);
        }
        if (panel.table) {
          const table = element("table", "panel-table");
          const columns = panel.table.columns || [];
          if (columns.length) {
            const head = element("tr");
            columns.forEach((column) => head.append(element("th", "", column)));
            table.append(element("thead"));
            table.tHead.append(head);
          }
          const tbody = element("tbody");
          (panel.table.rows || []).forEach((row) => {
            const tr = element("tr");
            row.forEach((cell) => tr.append(element("td", "", cell === null ? "—" : cell)));
            tbody.append(tr);
          });
          table.append(tbody);
          keep.push(table);
        }
        body.replaceChildren(...keep);
        if (panel.figure) Strata.draw(keep[0].id, panel.figure);
      } else if (panel.text) {
        body.replaceChildren(element("p", "panel-text", panel.text));
      }
    }

    function applyPanels(panels) {
      if (!panels) return;
      const container = document.getElementById("panels");
      const shown = new Set();
      panels.forEach((panel, index) => {
        shown.add(panel.slug);
        let section = Array.from(container.children).find((child) => child.dataset.panel === panel.slug);
        if (!section) {
          section = element("section", "card panel");
          section.dataset.panel = panel.slug;
          section.append(element("h2", "", panel.title), element("div", "panel-body"));
          container.append(section);
        }
        section.hidden = false;
        renderPanel(section.querySelector(".panel-body"), panel, index);
      });
      Array.from(container.children).forEach((child) => { child.hidden = !shown.has(child.dataset.panel); });
    }

    function applyState(data) {
      const badge = document.getElementById("job-state");
      if (badge.dataset.state !== data.state) {
        badge.dataset.state = data.state;
        badge.textContent = data.state;
      }
      document.getElementById("job-reason").textContent = data.reason || "";
      if (data.terminal) {
        const cancel = document.getElementById("cancel-form");
        if (cancel) cancel.remove();
      }
    }

    let tick = 0;
    let finalSeen = false;
    function url() {
      tick += 1;
      const query = new URLSearchParams({
        events_after: cursors.events, logs_after: cursors.logs, metrics_after: cursors.metrics,
      });
      if (finalSeen || tick % 4 === 0) query.set("panels", "1");
      query.set("state", document.getElementById("job-state").dataset.state);  // panels at once on a change
      return config.url + "?" + query.toString();
    }

    Strata.poll(url, config.interval_ms || 1500, (data) => {
      applyMetrics(data.metrics);  // before the state, so a SUCCEEDED badge means the charts are complete
      appendLogs(data.logs);
      appendEvents(data.events);
      Object.assign(cursors, data.cursors);
      swap("#job-facts", data.facts_html);
      swap("#attempts tbody", data.attempts_html);
      swap("#artifacts", data.artifacts_html);
      applyPanels(data.panels);
      applyState(data);
      if (data.terminal) {
        if (finalSeen && !data.more) return false;  // one last refresh after the job ended, then stop
        finalSeen = true;
      }
      return true;
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    initList();
    initSubmit();
    initDetail();
  });
})();
