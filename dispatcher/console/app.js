// The asyncd web console (docs/console.md): a client of the public HTTP API (docs/api.md)
// like any other, with the same bearer token. Every value from the API is untrusted
// (payloads and errors come from anyone who may submit), so the page is built with DOM
// nodes and text nodes only: nothing the server sends is ever parsed as HTML.

// The page is served at <base>/ui/; the API lives at <base>/v1/.
const API_BASE = new URL("../", document.baseURI);
const TOKEN_KEY = "asyncd-token";
// Overview counts stop here (MAX_JOB_COUNT in the contract): this value means "at least".
const COUNT_CAP = 100000;
const REFRESH_MS = 5000;
const PAGE_SIZE = 50;

// ---------------------------------------------------------------------------------------
// DOM

// An element with attributes and children. Functions under `on…` keys become listeners;
// strings and numbers become text nodes, so data can never become markup.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// A link to a page of this console: the route is ours, its parts are encoded.
function link(route, text, attrs = {}) {
  return h("a", { href: "#/" + route, ...attrs }, text);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(key, value);
  }
  const text = q.toString();
  return text ? "?" + text : "";
}

function table(headers, rows, empty) {
  if (rows.length === 0) return h("p", { class: "hint empty" }, empty);
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, headers.map(([label, cls]) => h("th", { class: cls }, label)))),
    h("tbody", {}, rows),
  );
}

let noticeTimer = null;
function notice(text, error = false) {
  const el = document.getElementById("notice");
  el.textContent = text;
  el.className = error ? "error" : "";
  el.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { el.hidden = true; }, error ? 15000 : 6000);
}

// ---------------------------------------------------------------------------------------
// Formatting

function count(n) {
  return n >= COUNT_CAP ? "≥ " + n : String(n);
}

function seconds(total) {
  if (total === null || total === undefined) return "—";
  if (total < 60) return total.toFixed(1) + " s";
  const s = Math.floor(total);
  const parts = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  const out = [];
  let rest = s;
  for (const [unit, name] of parts) {
    if (rest >= unit && out.length < 2) {
      out.push(Math.floor(rest / unit) + " " + name);
      rest %= unit;
    } else if (out.length > 0) {
      break;
    }
  }
  return out.join(" ");
}

function time(iso) {
  if (!iso) return "—";
  const at = Date.parse(iso);
  const delta = (at - Date.now()) / 1000;
  const relative = Math.abs(delta) < 1 ? "now"
    : delta > 0 ? "in " + seconds(delta) : seconds(-delta) + " ago";
  return h("time", { datetime: iso, title: relative }, iso.replace("T", " ").replace(".000Z", "Z"));
}

function badge(text, cls = text) {
  return h("span", { class: "badge " + cls }, text);
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

function clip(text, max = 160) {
  if (!text) return "";
  return text.length > max ? text.slice(0, max) + "…" : text;
}

// ---------------------------------------------------------------------------------------
// API

class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error;
    super(error && error.message ? error.message : "HTTP " + status);
    this.status = status;
    this.code = error && error.code;
    // The member at fault, when the server names one ("cron", "name", …).
    this.field = error && error.field;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(new URL(path.replace(/^\//, ""), API_BASE), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401) askToken(error.message);
    throw error;
  }
  return data;
}

// Every job the caller may read, for the pages that filter by job.
async function jobs() {
  return (await api("GET", "/v1/jobs")).jobs;
}

// ---------------------------------------------------------------------------------------
// Token

function askToken(why) {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-why").textContent = why
    ? "The server asks for a credential: " + why
    : "The token the server checks (--auth tokens: an API token; --auth kubernetes: a ServiceAccount token).";
  if (!dialog.open) dialog.showModal();
  document.getElementById("token-input").focus();
}

function setupToken() {
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  document.getElementById("token-button").addEventListener("click", () => askToken());
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    input.value = "";
    dialog.close();
    render();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    input.value = "";
    dialog.close();
    notice("Token forgotten.");
    render();
  });
  document.getElementById("token-cancel").addEventListener("click", () => dialog.close());
}

// ---------------------------------------------------------------------------------------
// Pages. Each fills `view` (not yet on screen) and may register a refresh; `live()` says
// whether the page is still the one shown, so a late answer never paints over another.

let generation = 0;
let refreshTimer = null;

function errorBox(error) {
  const status = error.status ? " (" + error.status + (error.code ? " " + error.code : "") + ")" : "";
  return h("pre", { class: "error", id: "error" }, String(error.message || error) + status);
}

async function action(label, run, after) {
  try {
    await run();
    notice(label);
    if (after) await after();
  } catch (error) {
    notice(label.replace(/\.$/, "") + " failed: " + error.message, true);
  }
}

function jobsTable(list, refresh) {
  const rows = list.map((job) => {
    const s = job.stats;
    const late = s.oldest_due_seconds !== null && s.oldest_due_seconds > 60;
    const resting = job.resting_keys || [];
    const tenants = job.tenants || [];
    const keys = job.keys || [];
    const state = [
      ...(job.paused ? [badge("paused"), job.paused_by_config ? " by config" : ""] : [badge("active")]),
      // Keys an executor's 429 or 503 rests: how many, and each with its end on hover.
      resting.length
        ? h("span", {
          class: "resting", "data-col": "resting",
          title: resting.map((r) => r.key + " until " + r.until).join("\n"),
        }, " · " + resting.length + (resting.length === 1 ? " key resting" : " keys resting"))
        : "",
      // A fair job's busiest tenants: how many, and each one's usage and share on hover.
      tenants.length
        ? h("span", {
          class: "tenants", "data-col": "tenants",
          title: tenants.map((t) => t.tenant + ": " + t.running + " running, " + t.due + " due, weight "
            + t.weight + ", fair share " + t.fair_share.toFixed(1)).join("\n"),
        }, " · " + tenants.length + (tenants.length === 1 ? " tenant" : " tenants") + " with work")
        : "",
      // A keyed job's busiest keys: how many, and each one's usage on hover.
      keys.length
        ? h("span", {
          class: "keys", "data-col": "keys",
          title: keys.map((k) => k.key + ": " + k.running + " running, " + k.due + " due").join("\n"),
        }, " · " + keys.length + (keys.length === 1 ? " key" : " keys") + " with work")
        : "",
    ];
    const name = job.job;
    const toggle = job.paused_at
      ? h("button", {
        type: "button", class: "resume", "data-job": name,
        onclick: () => action("Resumed " + name + ".", () => api("POST", "/v1/jobs/" + encodeURIComponent(name) + "/resume"), refresh),
      }, "Resume")
      : h("button", {
        type: "button", class: "pause danger", "data-job": name,
        onclick: () => action("Paused " + name + ".", () => api("POST", "/v1/jobs/" + encodeURIComponent(name) + "/pause"), refresh),
      }, "Pause");
    return h("tr", { "data-job": name },
      h("td", {}, link("tasks" + query({ job: name }), name)),
      h("td", { class: "mono" }, job.task_type),
      h("td", { "data-col": "state" }, state),
      h("td", { class: "num", "data-col": "due" }, count(s.due)),
      h("td", { class: "num", "data-col": "scheduled" }, count(s.scheduled)),
      h("td", { class: "num", "data-col": "running" }, count(s.running)),
      h("td", { class: "num" + (late ? " late" : ""), "data-col": "lateness" }, seconds(s.oldest_due_seconds)),
      h("td", { class: "num", "data-col": "succeeded" }, count(s.finished_last_minute.succeeded)),
      h("td", { class: "num", "data-col": "failed" }, count(s.finished_last_minute.dead)),
      h("td", { class: "num", "data-col": "dead" }, s.dead > 0 ? link("dead" + query({ job: name }), count(s.dead)) : "0"),
      h("td", { class: "num" }, job.cron.length ? link("cron", String(job.cron.length)) : "—"),
      h("td", {}, toggle),
    );
  });
  return table([
    ["Job"], ["Task type"], ["State"], ["Due", "num"], ["Scheduled", "num"], ["Running", "num"],
    ["Oldest due", "num"], ["Succeeded/min", "num"], ["Dead/min", "num"], ["Dead letters", "num"],
    ["Cron", "num"], [""],
  ], rows, "No job is declared, or none you may read.");
}

async function jobsPage(view, live) {
  const body = h("div", { id: "jobs" });
  view.append(
    h("h1", {}, "Jobs"),
    h("p", { class: "hint" },
      "Due: waiting and due now; oldest due: how late the job is. Succeeded/min and Dead/min count the tasks that finished in the last 60 s. Refreshed every 5 s."),
    body,
  );
  const refresh = async () => {
    const list = await jobs();
    if (live()) body.replaceChildren(jobsTable(list, refresh));
  };
  await refresh();
  // Set only while this page is shown: render() clears it when the page changes.
  if (live()) {
    refreshTimer = setInterval(
      () => refresh().catch((error) => live() && body.replaceChildren(errorBox(error))),
      REFRESH_MS,
    );
  }
}

async function cronPage(view) {
  const list = await jobs();
  const rows = [];
  for (const job of list) {
    for (const entry of job.cron) {
      rows.push(h("tr", {},
        h("td", {}, job.job, job.paused ? [" ", badge("paused")] : ""),
        h("td", {}, entry.name, entry.paused ? [" ", badge("paused")] : ""),
        h("td", { class: "mono" }, entry.schedule),
        h("td", { class: "policy" }, entry.overlap === "Skip" ? "skip while running" : "allow"),
        h("td", { class: "mono policy" }, entry.catch_up),
        h("td", {}, entry.next.length
          ? h("ul", { class: "firings" }, entry.next.map((at) => h("li", {}, time(at))))
          : "never again"),
      ));
    }
  }
  view.append(
    h("h1", {}, "Cron entries"),
    h("p", { class: "hint" }, "The next three firings of each entry, in UTC (hover for how far off). A paused job's firings are created and wait; a paused entry creates none. Overlap: whether a firing runs while the previous one has not finished; catch-up: how far back firings missed in an outage are still created."),
    table([["Job"], ["Entry"], ["Schedule"], ["Overlap"], ["Catch-up"], ["Next firings"]], rows, "No job has cron entries."),
  );
}

// A filter form whose submit moves to `page` with the form's values as the query.
function filterForm(page, fields) {
  const form = h("form", { class: "filters", id: page + "-filters" }, fields, h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = {};
    for (const el of form.elements) if (el.name) values[el.name] = el.value.trim();
    const target = page + query(values);
    if (location.hash === "#/" + target) render(); else location.hash = "#/" + target;
  });
  return form;
}

// The form fields; `prefix` keeps ids unique when two forms share a page.
function jobSelect(list, selected, prefix = "filter") {
  return h("label", {}, "Job",
    h("select", { name: "job", id: prefix + "-job" },
      h("option", { value: "" }, "any"),
      list.map((job) => h("option", { value: job.job, selected: job.job === selected }, job.job)),
    ));
}

function input(label, name, value, attrs = {}, prefix = "filter") {
  return h("label", {}, label, h("input", { name, id: prefix + "-" + name, value: value || "", ...attrs }));
}

const STATES = ["blocked", "pending", "claimed", "running", "succeeded", "dead", "cancelled", "expired"];

function taskRows(items, extra) {
  return items.map((task) => h("tr", { "data-id": task.id },
    h("td", { class: "id" }, link("task/" + encodeURIComponent(task.id), task.id)),
    h("td", { class: "mono" }, task.type),
    h("td", {}, badge(task.state)),
    h("td", { class: "num" }, task.attempt + " / " + (task.max_retries + 1)),
    h("td", {}, time(task.eta)),
    h("td", {}, time(task.created_at)),
    h("td", { class: "error" }, clip(task.last_error)),
    extra ? h("td", {}, extra(task)) : null,
  ));
}

const TASK_HEADERS = [["Id"], ["Type"], ["State"], ["Attempts", "num"], ["ETA"], ["Created"], ["Last error"]];

// A listing page by page: `fetchPage(cursor)` answers a TaskPage.
async function paged(container, headers, fetchPage, extra, empty) {
  let cursor;
  const tbody = h("tbody");
  const more = h("button", { type: "button", id: "more" }, "More");
  const load = async () => {
    const page = await fetchPage(cursor);
    tbody.append(...taskRows(page.items, extra));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    return page.items.length;
  };
  more.addEventListener("click", () => load().catch((error) => notice(error.message, true)));
  const first = await load();
  if (first === 0) {
    container.append(h("p", { class: "hint empty" }, empty));
    return;
  }
  container.append(
    h("table", { id: "results" },
      h("thead", {}, h("tr", {}, headers.map(([label, cls]) => h("th", { class: cls }, label)))),
      tbody),
    h("div", { class: "actions" }, more),
  );
}

async function tasksPage(view, live, params) {
  const list = await jobs();
  const id = params.get("id");
  const opener = h("form", { class: "filters", id: "open-task" },
    input("Task id", "id", id, { size: 38, spellcheck: "false" }),
    h("button", { type: "submit" }, "Open"));
  opener.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = opener.querySelector("input").value.trim();
    if (value) location.hash = "#/task/" + encodeURIComponent(value);
  });
  const filters = filterForm("tasks", [
    jobSelect(list, params.get("job")),
    input("Task type", "type", params.get("type")),
    h("label", {}, "State", h("select", { name: "state", id: "filter-state" },
      h("option", { value: "" }, "any"),
      STATES.map((s) => h("option", { value: s, selected: s === params.get("state") }, s)))),
    input("Unique key", "unique_key", params.get("unique_key")),
  ]);
  const results = h("div");
  view.append(h("h1", {}, "Tasks"), opener, filters, results);
  const filter = {
    job: params.get("job"), type: params.get("type"), state: params.get("state"),
    unique_key: params.get("unique_key"),
  };
  await paged(results, TASK_HEADERS,
    (cursor) => api("GET", "/v1/tasks" + query({ ...filter, limit: PAGE_SIZE, cursor })),
    null, "No task matches.");
}

async function taskPage(view, live, params, id) {
  const task = await api("GET", "/v1/tasks/" + encodeURIComponent(id));
  const reload = () => render();
  const actions = h("div", { class: "actions" });
  if (["blocked", "pending", "claimed"].includes(task.state)) {
    actions.append(h("button", {
      type: "button", class: "danger", id: "cancel",
      onclick: () => confirm("Cancel task " + task.id + "?") &&
        action("Cancelled " + task.id + ".", () => api("DELETE", "/v1/tasks/" + encodeURIComponent(task.id)), reload),
    }, "Cancel"));
  }
  if (task.state === "dead") {
    actions.append(h("button", {
      type: "button", id: "redrive",
      onclick: () => action("Redrove " + task.id + ".", () => api("POST", "/v1/dead-letters/" + encodeURIComponent(task.id) + "/redrive"), reload),
    }, "Redrive"));
  }
  const field = (label, value) => [h("dt", {}, label), h("dd", {}, value === null || value === undefined || value === "" ? "—" : value)];
  view.append(
    h("h1", {}, "Task ", h("span", { class: "mono", id: "task-id" }, task.id)),
    h("dl", { class: "task" },
      field("Type", h("span", { class: "mono" }, task.type)),
      field("State", h("span", { id: "task-state" }, badge(task.state))),
      field("Attempts", h("span", { id: "task-attempts" }, task.attempt + " started, at most " + (task.max_retries + 1))),
      field("Priority", task.priority),
      field("ETA", time(task.eta)),
      field("Created", time(task.created_at)),
      field("Updated", time(task.updated_at)),
      field("Lease until", task.lease_until ? time(task.lease_until) : null),
      field("Idempotency key", task.idempotency_key),
      field("Unique key", task.unique_key),
      field("Depends on", task.depends_on && task.depends_on.length
        ? h("ul", {}, task.depends_on.map((dep) => h("li", {}, link("task/" + encodeURIComponent(dep), dep))))
        : null),
    ),
    actions,
    h("h2", {}, "Last error"),
    task.last_error ? h("pre", { class: "error", id: "task-error" }, task.last_error) : h("p", { class: "hint" }, "None."),
    h("h2", {}, "Payload"),
    h("pre", { id: "task-payload" }, json(task.payload)),
    task.result !== null && task.result !== undefined ? [h("h2", {}, "Result"), h("pre", { id: "task-result" }, json(task.result))] : null,
  );
}

// Bulk redrive or purge of the dead letters a filter matches (POST
// /v1/dead-letters/redrive|purge): a dry run says how many, then calls of up to 1000
// each until none remain. Each call is idempotent, so an interrupted run is run again.
function bulkPanel(list, params) {
  const status = h("p", { class: "hint", id: "bulk-status" });
  const fields = h("form", { class: "filters", id: "bulk-filters" },
    jobSelect(list, params.get("job"), "bulk"),
    input("Task type", "type", params.get("type"), {}, "bulk"),
    input("Error starts with", "error_prefix", "", {}, "bulk"),
    input("Dead after (RFC 3339)", "dead_after", "", { placeholder: "2026-11-30T00:00:00Z" }, "bulk"),
    input("Dead before (RFC 3339)", "dead_before", "", { placeholder: "2026-11-30T06:00:00Z" }, "bulk"),
  );
  fields.addEventListener("submit", (event) => event.preventDefault());
  const run = async (verb) => {
    const filter = {};
    for (const el of fields.elements) if (el.name && el.value.trim()) filter[el.name] = el.value.trim();
    if (!filter.job && !filter.type) {
      notice("Choose a job or a task type first.", true);
      return;
    }
    const path = "/v1/dead-letters/" + verb;
    try {
      const preview = await api("POST", path, { ...filter, dry_run: true });
      if (preview.matched === 0) {
        status.textContent = "No dead letter matches.";
        return;
      }
      const question = verb === "purge"
        ? "Delete " + preview.matched + " dead letters for good?"
        : "Redrive " + preview.matched + " dead letters?";
      if (!confirm(question)) return;
      // Every call keeps the dry run's cutoff: a redriven task that dies again meanwhile
      // died after it, so this loop never takes it twice.
      const pinned = { ...filter, dead_before: preview.dead_before, dry_run: false, limit: 1000 };
      const done = verb === "purge" ? "Purged " : "Redrove ";
      let affected = 0;
      let step;
      do {
        step = await api("POST", path, pinned);
        affected += step.affected;
        status.textContent = done + affected + " of " + preview.matched + ", " + step.remaining + " remaining" +
          (step.skipped ? ", " + step.skipped + " left alone (a unique key held elsewhere, or a blocked task waits on it)" : "") + ".";
      } while (step.remaining > 0 && step.affected > 0);
      notice(done + affected + " dead letters.");
      render();
    } catch (error) {
      const missing = error.status === 404 && error.code === "not_found" && /no such endpoint/.test(error.message);
      status.textContent = missing
        ? "This server has no bulk dead-letter endpoints; redrive one task at a time."
        : "Stopped: " + error.message + " (run it again to go on: each call is idempotent).";
    }
  };
  return h("div", { class: "panel", id: "bulk" },
    h("h2", {}, "All matching dead letters"),
    fields,
    h("div", { class: "actions" },
      h("button", { type: "button", id: "bulk-redrive", onclick: () => run("redrive") }, "Redrive all matching"),
      h("button", { type: "button", class: "danger", id: "bulk-purge", onclick: () => run("purge") }, "Purge all matching")),
    status,
  );
}

async function deadPage(view, live, params) {
  const list = await jobs();
  // The listing filters by task type; a job filter names its type.
  const job = list.find((j) => j.job === params.get("job"));
  const type = params.get("type") || (job ? job.task_type : "");
  const results = h("div");
  view.append(
    h("h1", {}, "Dead letters"),
    h("p", { class: "hint" }, "Tasks that ran out of retries, failed for good, or whose dependency died; the latest due first."),
    filterForm("dead", [jobSelect(list, params.get("job")), input("Task type", "type", params.get("type"))]),
    results,
    bulkPanel(list, params),
  );
  await paged(results, [...TASK_HEADERS, [""]],
    (cursor) => api("GET", "/v1/dead-letters" + query({ type, limit: PAGE_SIZE, cursor })),
    (task) => h("button", {
      type: "button", class: "redrive", "data-id": task.id,
      onclick: (event) => action("Redrove " + task.id + ".", async () => {
        await api("POST", "/v1/dead-letters/" + encodeURIComponent(task.id) + "/redrive");
        event.target.closest("tr").remove();
      }),
    }, "Redrive"),
    "No dead letters.");
}

// ---------------------------------------------------------------------------------------
// Schedules (docs/api.md "Schedules"): a job's schedules by name, its spec.cron entries
// among them (source "config": read-only here — change the AsyncJobConfig — but they can
// be triggered).

const OVERLAPS = ["Allow", "Skip", "BufferOne", "CancelOther"];

function schedulePath(job, name, verb) {
  return "/v1/schedules/" + encodeURIComponent(job) + "/" + encodeURIComponent(name) + (verb ? "/" + verb : "");
}

// One schedule's row; its buttons redraw it (or remove it) from the server's answer.
function scheduleRow(schedule) {
  const { job, name } = schedule;
  const readOnly = schedule.source === "config";
  const path = (verb) => schedulePath(job, name, verb);
  let row;
  const redraw = (fresh) => row.isConnected && row.replaceWith(scheduleRow(fresh));
  const button = (cls, label, onclick) =>
    h("button", { type: "button", class: cls, "data-schedule": name, onclick }, label);
  const buttons = [];
  if (!readOnly) {
    buttons.push(schedule.paused
      ? button("resume", "Resume", () => action("Resumed schedule " + name + ".", async () => redraw(await api("POST", path("resume")))))
      : button("pause", "Pause", () => action("Paused schedule " + name + ".", async () => redraw(await api("POST", path("pause"))))));
  }
  buttons.push(button("trigger", "Trigger", async () => {
    try {
      const fired = await api("POST", path("trigger"));
      notice("Triggered schedule " + name + ": task " + fired.id + ".");
      redraw(await api("GET", path()));
    } catch (error) {
      notice("Trigger of " + name + " failed: " + error.message, true);
    }
  }));
  if (!readOnly) {
    buttons.push(button("delete danger", "Delete", () =>
      confirm("Delete schedule " + name + " of job " + job + "? The tasks it created stay.") &&
      action("Deleted schedule " + name + ".", async () => {
        await api("DELETE", path());
        row.remove();
      })));
  }
  const last = schedule.last_firing && schedule.last_task_id
    ? link("task/" + encodeURIComponent(schedule.last_task_id), time(schedule.last_firing))
    : time(schedule.last_firing);
  row = h("tr", { "data-schedule": name, "data-source": schedule.source },
    h("td", { class: "mono name", "data-col": "name" }, name),
    h("td", { "data-col": "source" }, badge(schedule.source), readOnly ? [" ", badge("read-only", "read-only")] : ""),
    h("td", { class: "mono", "data-col": "when" }, schedule.cron ? schedule.cron : "every " + schedule.every),
    h("td", { "data-col": "overlap" }, schedule.overlap),
    h("td", { "data-col": "state" }, schedule.paused ? badge("paused") : badge("active")),
    h("td", { "data-col": "next" }, time(schedule.next_firing)),
    h("td", { "data-col": "last" }, last),
    h("td", { class: "num", "data-col": "fired" }, String(schedule.fired)),
    h("td", { class: "mono payload", "data-col": "payload", title: json(schedule.payload) }, clip(JSON.stringify(schedule.payload), 80)),
    h("td", { class: "buttons" }, buttons),
  );
  return row;
}

// The job's schedules, PAGE_SIZE at a time: "More" follows next_cursor.
function scheduleListing(job) {
  const container = h("div", { id: "schedules" });
  const more = h("button", { type: "button", id: "schedules-more" }, "More");
  let cursor;
  let tbody = h("tbody");
  const load = async () => {
    const into = tbody;
    const page = await api("GET", "/v1/schedules" + query({ job, limit: PAGE_SIZE, cursor }));
    if (into !== tbody) return 0;  // reloaded meanwhile
    into.append(...page.items.map(scheduleRow));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    return page.items.length;
  };
  more.addEventListener("click", () => load().catch((error) => notice(error.message, true)));
  const reload = async () => {
    cursor = undefined;
    tbody = h("tbody");
    const first = await load();
    container.replaceChildren(...(first === 0
      ? [h("p", { class: "hint empty" }, "This job has no schedules.")]
      : [
        h("table", { id: "schedule-list" },
          h("thead", {}, h("tr", {}, [
            ["Name"], ["Source"], ["Cron or every"], ["Overlap"], ["State"], ["Next firing"],
            ["Last firing"], ["Fired", "num"], ["Payload"], [""],
          ].map(([label, cls]) => h("th", { class: cls }, label)))),
          tbody),
        h("div", { class: "actions" }, more),
      ]));
  };
  return { container, reload };
}

// The form that creates a schedule of `job` (POST /v1/schedules). The server checks
// everything; its error is shown with the field it names, and that field marked.
function scheduleForm(job, created) {
  const prefix = "schedule";
  const problem = h("div", { class: "form-error", id: "schedule-error", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", id: "schedule-create" }, "Create");
  const form = h("form", { class: "filters schedule", id: "schedule-form" },
    input("Name", "name", "", { spellcheck: "false", placeholder: "weekly-42" }, prefix),
    input("Cron", "cron", "", { spellcheck: "false", size: 34, placeholder: "CRON_TZ=Europe/Berlin 0 9 * * MON" }, prefix),
    input("or every", "every", "", { spellcheck: "false", placeholder: "15m" }, prefix),
    h("label", {}, "Overlap", h("select", { name: "overlap", id: "schedule-overlap" },
      OVERLAPS.map((o) => h("option", { value: o }, o)))),
    h("label", { class: "check" },
      h("input", { type: "checkbox", name: "paused", id: "schedule-paused" }), "Paused"),
    h("label", { class: "wide" }, "Payload (JSON; {{scheduled_at}} and {{schedule}} are filled in)",
      h("textarea", { name: "payload", id: "schedule-payload", rows: 4, spellcheck: "false" }, "{}")),
    submit,
  );
  const field = (name) => form.elements.namedItem(name);
  const show = (error) => {
    const at = error.field ? field(error.field) : null;
    if (at instanceof Element) {
      at.classList.add("invalid");
      at.setAttribute("aria-invalid", "true");
      at.focus();
    }
    const status = error.status ? " (" + error.status + (error.code ? " " + error.code : "") + ")" : "";
    problem.replaceChildren(
      error.field ? h("p", {}, "Field ", h("code", { id: "schedule-error-field" }, error.field)) : null,
      h("p", { id: "schedule-error-message" }, String(error.message || error) + status),
    );
    problem.hidden = false;
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.hidden = true;
    problem.replaceChildren();
    for (const el of form.elements) {
      el.classList.remove("invalid");
      el.removeAttribute("aria-invalid");
    }
    const value = (name) => field(name).value.trim();
    const body = { job, name: value("name"), overlap: value("overlap"), paused: field("paused").checked };
    if (value("cron")) body.cron = value("cron");
    if (value("every")) body.every = value("every");
    if (value("payload")) {
      try {
        body.payload = JSON.parse(value("payload"));
      } catch (error) {
        show({ field: "payload", message: "payload: not JSON: " + error.message });
        return;
      }
    }
    submit.disabled = true;
    try {
      const schedule = await api("POST", "/v1/schedules", body);
      notice("Created schedule " + schedule.name + ".");
      form.reset();
      await created(schedule);
    } catch (error) {
      show(error);
    } finally {
      submit.disabled = false;
    }
  });
  return h("div", { class: "panel", id: "schedule-new" },
    h("h2", {}, "New schedule of ", h("span", { class: "mono" }, job)),
    form,
    problem,
  );
}

async function schedulesPage(view, live, params) {
  const list = await jobs();
  view.append(
    h("h1", {}, "Schedules"),
    h("p", { class: "hint" },
      "A job's schedules, by name: those made through the API, and its config's spec.cron entries (source config: read-only here, change the AsyncJobConfig; they can still be triggered). Times in UTC (hover for how far off)."),
  );
  if (list.length === 0) {
    view.append(h("p", { class: "hint empty" }, "No job is declared, or none you may read."));
    return;
  }
  const wanted = params.get("job");
  const job = list.some((j) => j.job === wanted) ? wanted : list[0].job;
  const select = h("select", { name: "job", id: "schedules-job" },
    list.map((j) => h("option", { value: j.job, selected: j.job === job }, j.job)));
  select.addEventListener("change", () => { location.hash = "#/schedules" + query({ job: select.value }); });
  const chooser = h("form", { class: "filters", id: "schedules-filters" }, h("label", {}, "Job", select));
  chooser.addEventListener("submit", (event) => event.preventDefault());
  const listing = scheduleListing(job);
  view.append(chooser, listing.container, scheduleForm(job, () => listing.reload()));
  await listing.reload();
}

const PAGES = {
  jobs: jobsPage, tasks: tasksPage, task: taskPage, dead: deadPage, cron: cronPage,
  schedules: schedulesPage,
};

// #/<page>/<argument>?<query>
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, search = ""] = hash.split("?", 2);
  const [page, ...rest] = path.split("/");
  return {
    page: PAGES[page] ? page : "jobs",
    argument: decodeURIComponent(rest.join("/")),
    params: new URLSearchParams(search),
  };
}

async function render() {
  clearInterval(refreshTimer);
  const mine = ++generation;
  const live = () => mine === generation;
  const { page, argument, params } = route();
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("current", a.dataset.page === page || (page === "task" && a.dataset.page === "tasks"));
  }
  const view = h("div", { class: "view", "data-page": page });
  try {
    await PAGES[page](view, live, params, argument);
  } catch (error) {
    view.replaceChildren(errorBox(error));
  }
  if (live()) document.getElementById("main").replaceChildren(view);
}

setupToken();
window.addEventListener("hashchange", render);
render();
