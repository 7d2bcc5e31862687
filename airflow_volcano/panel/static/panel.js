// The Volcano Job panel: asks its JSON (the same path under /api/) and shows it, every 5 s while the
// task runs or is deferred. Every text is set with textContent: nothing from the cluster is HTML.
"use strict";
const REFRESH_MS = 5000;
// goodput.BUCKETS, in its order.
const COLOURS = { queued: "#9e9e9e", starting: "#42a5f5", running: "#2e7d32", restarting: "#ef6c00",
                  preempted: "#6d4c41", stalled: "#c62828", redone: "#8e24aa" };
const api = location.pathname.replace("/ti/", "/api/ti/");
let chosenPod = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clock(epoch) {
  return epoch ? new Date(epoch * 1000).toISOString().slice(11, 19) + " UTC" : "";
}

function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds || 0));
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m" + String(seconds % 60).padStart(2, "0") + "s";
  return Math.floor(seconds / 3600) + "h" + String(Math.floor(seconds % 3600 / 60)).padStart(2, "0") + "m";
}

function section(title, ...body) { return el("section", {}, el("h2", {}, title), ...body); }

function header(data) {
  const job = data.job;
  const facts = [`queue ${job.queue}`, job.priority_class ? `priority class ${job.priority_class}` : null,
                 job.volcano_release, job.age_seconds !== null ? `age ${duration(job.age_seconds)}` : null,
                 `restarts ${job.restarts}` + (job.restart_budget ? ` (${job.restart_budget})` : ""),
                 `uid ${job.uid}`].filter(Boolean);
  return el("header", {}, el("h1", {}, `Volcano Job ${job.namespace}/${job.name}`,
                                 el("span", { class: `badge phase-${job.phase}` }, job.phase)),
            el("p", { class: "facts" }, facts.join(" · ")));
}

function timeline(job) {
  return section("Timeline", el("ol", { class: "timeline" },
    job.timeline.map((step) => el("li", {}, `${clock(step.at)} ${step.phase}`))));
}

function progress(data) {
  const p = data.progress;
  return section("Progress", el("div", { class: "progress" }, el("span", { style: `width:${p.percent || 0}%` })),
                 el("p", {}, p.text));
}

function goodput(data) {
  const g = data.goodput;
  const buckets = Object.keys(COLOURS).filter((bucket) => g[`${bucket}_seconds`] > 0);
  const total = g.wall_seconds || 1;
  const bar = el("div", { class: "bar", role: "img", "aria-label": "where the time went" },
    buckets.map((bucket) => el("span", { title: `${bucket} ${duration(g[`${bucket}_seconds`])}`,
      style: `width:${100 * g[`${bucket}_seconds`] / total}%;background:${COLOURS[bucket]}` })));
  const legend = el("div", { class: "legend" }, Object.keys(COLOURS).map((bucket) =>
    el("span", {}, el("i", { style: `background:${COLOURS[bucket]}` }),
       `${bucket} ${duration(g[`${bucket}_seconds`])}`)));
  const held = g.goodput === null ? "" :
    ` · goodput ${(100 * g.goodput).toFixed(1)}% of the held time` +
    (g.accelerator_hours ? `, ${g.accelerator_hours.toPrecision(3)} accelerator-hours` : "");
  return section("Where the time went", bar, legend,
                 el("p", { class: "muted" }, `${duration(g.wall_seconds)} from submit${held}`));
}

function preemptions(data) {
  const rows = data.preemptions;
  return section(`Preemptions (${rows.length})`, el("ol", { class: "preemptions" },
    rows.map((row) => el("li", {}, `Preempted at ${row.text}`))));
}

function pods(data) {
  const head = el("tr", {}, ["task", "pod", "phase", "node", "restarts", "exit code", "reason", "started",
                             "finished"].map((name) => el("th", {}, name)));
  const rows = data.pods.map((pod) => el("tr", { class: pod.first_failure ? "first-failure" : "" },
    el("td", {}, pod.task), el("td", {}, pod.name, pod.first_failure ? el("span", { class: "first" }, " (first failure)") : null),
    el("td", {}, pod.phase), el("td", {}, pod.node || ""), el("td", {}, pod.restarts),
    el("td", {}, pod.exit_code ?? ""), el("td", {}, pod.reason || ""), el("td", {}, clock(pod.started)),
    el("td", {}, clock(pod.finished))));
  return section("Tasks and pods", rows.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, rows))
                                               : el("p", { class: "muted" }, "No pod yet."));
}

function logs(data) {
  if (data.log_denied) return section("Last log lines", el("p", { class: "muted", id: "log-denied" }, data.log_denied));
  const names = data.pods.map((pod) => pod.name);
  const shown = data.log ? data.log.pod : null;
  if (shown && !names.includes(shown)) names.unshift(shown);
  const select = el("select", { "aria-label": "pod" }, names.map((name) => {
    const option = el("option", { value: name }, name);
    if (name === shown) option.selected = true;
    return option;
  }));
  select.addEventListener("change", () => { chosenPod = select.value; refresh(); });
  const lines = data.log && data.log.lines.length ? data.log.lines.join("\n")
    : (data.log && data.log.gone ? "(no log: the pod has not started, or is gone)" : "(no log yet)");
  return section("Last log lines", el("p", {}, "Pod ", select), el("pre", { class: "log" }, lines));
}

// A link from the task's XCom (which users may write): http(s) only, never `javascript:` or `data:`.
function safeUrl(url) {
  try {
    const parsed = new URL(String(url));
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch (error) {
    return null;
  }
}

// The log box opens on its newest line; a viewer who scrolled up stays where they were at each refresh.
function logScroll() {
  const box = document.querySelector("pre.log");
  if (!box) return null;
  return { pod: chosenPod, top: box.scrollTop, atBottom: box.scrollTop + box.clientHeight >= box.scrollHeight - 4 };
}

function restoreLogScroll(before) {
  const box = document.querySelector("pre.log");
  if (!box) return;
  box.scrollTop = before && !before.atBottom && before.pod === chosenPod ? before.top : box.scrollHeight;
}

function render(data) {
  const panel = document.getElementById("panel");
  const parts = [];
  if (!data.job) {
    parts.push(el("p", { class: "muted" }, data.message || "No Volcano Job."));
  } else {
    parts.push(header(data));
    if (data.message) parts.push(el("p", { class: "callout" }, data.message));
    if (data.waiting) parts.push(section("Why it waits", el("p", { class: "callout" }, data.waiting)));
    if (data.progress) parts.push(progress(data));
    if (data.goodput) parts.push(goodput(data));
    if (data.preemptions && data.preemptions.length) parts.push(preemptions(data));
    parts.push(pods(data));
    if (data.failure) parts.push(section("Failure", el("pre", { class: "failure" }, data.failure)));
    if (data.stacks && data.stacks.length) parts.push(section("Stacks at the stall", el("pre", {}, data.stacks.join("\n"))));
    parts.push(logs(data));
    parts.push(timeline(data.job));
    const links = Object.entries(data.links || {}).map(([name, url]) => [name, safeUrl(url)]).filter(([, url]) => url);
    if (links.length) parts.push(section("Links", el("ul", {}, links.map(([name, url]) =>
      el("li", {}, el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, name))))));
  }
  const source = data.source === "recorded" ? "as the task recorded it when it ended" : "from the cluster";
  parts.push(el("p", { class: "muted", id: "status" }, `Task ${data.task.state || "not run"}` +
    (data.job ? `; shown ${source} at ${new Date().toISOString().slice(11, 19)} UTC` : "") +
    (data.task.live ? ", refreshing every 5 s" : "")));
  const scroll = logScroll();
  panel.replaceChildren(...parts);
  restoreLogScroll(scroll);
  return data.task.live;
}

// A read the API server has not answered in this long is said on the page, and asked again.
const ANSWER_MS = 30000;

// What stops a refresh, said in the status line (the last panel shown stays above it): a page never sits
// at "Loading" saying nothing.
function notice(text) {
  const status = document.getElementById("status");
  if (status) status.textContent = text;
  else document.getElementById("panel").append(el("p", { class: "muted", id: "status" }, text));
}

async function refresh() {
  const aborter = new AbortController();
  const timer = setTimeout(() => aborter.abort(), ANSWER_MS);
  let response;
  try {
    response = await fetch(api + (chosenPod ? `?pod=${encodeURIComponent(chosenPod)}` : ""),
                           { credentials: "same-origin", signal: aborter.signal });
  } catch (error) {
    notice(aborter.signal.aborted ? `The API server has not answered in ${ANSWER_MS / 1000} s; asking again.`
      : "The API server cannot be reached (restarting?); trying again.");
    return true;
  } finally {
    clearTimeout(timer);
  }
  if (!response.ok) {
    const detail = response.status === 404 ? ((await response.json().catch(() => ({}))).detail || "") : "";
    if (response.status === 404 && chosenPod) chosenPod = null;  // the next refresh shows the main pod
    document.getElementById("panel").replaceChildren(el("p", { class: "muted", id: "status" },
      response.status === 401 || response.status === 403 ? "You may not read this task instance."
        : detail || `The panel could not be read (HTTP ${response.status}).`));
    return true;
  }
  try {
    return render(await response.json());
  } catch (error) {
    notice(`The panel could not show the API server's answer (${error}); trying again.`);
    return true;
  }
}

async function loop() {
  if (await refresh()) setTimeout(loop, REFRESH_MS);
}
loop();
