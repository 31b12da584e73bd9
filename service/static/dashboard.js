// The dashboard: polls the REST API once a second and redraws jobs, the selected job's chart and the workers.
// A single job is charted in GFLOPS per trial; a model job by its estimated latency, beside its tasks.
"use strict";

const POLL_MS = 1000;
let selected = null;   // the job id shown in detail; null picks the newest running (or newest) job
let chart = null;      // the uPlot chart of the selected job
let numpy = null;      // NumPy's GFLOPS for the selected single job's workload

const $ = (id) => document.getElementById(id);

async function getJson(path) {
  const response = await fetch(path);
  if (!response.ok) {  // the server's reason when it gives one (a 503 names the database outage)
    const detail = await response.json().then((body) => body.detail, () => null);
    throw new Error(`${path}: ${response.status}${detail ? ` ${detail}` : ""}`);
  }
  return response.json();
}

// Text that a line may break after each comma (a target's features, a workload key's parameters) and nowhere
// else in a word: <wbr>, so that the text reads and copies as written.
function breakingAfterCommas(text) {
  return String(text).split(/(?<=,)/).flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part]));
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.replaceChildren(...breakingAfterCommas(text));
  if (className) td.className = className;
  return td;
}

function fixed(value) { return value == null ? "–" : value.toFixed(1); }

// A queued job whose target no worker host serves yet, e.g. "waiting for a GPU worker (sm_90)"; "" otherwise.
function waitingFor(job) { return job.waiting ? `waiting for ${job.waiting}` : ""; }

function reason(text, kind) {  // a line under a job's status: why it failed, or what it waits for
  return Object.assign(document.createElement("div"), {className: `${kind} reason`, textContent: text});
}

function renderJobs(jobs) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const job of jobs) {
    const row = body.insertRow();
    row.dataset.id = job.id;
    row.classList.toggle("selected", job.id === selected);
    row.onclick = () => { selectJob(job); refresh(); };
    cell(row, job.id);
    cell(row, job.model ? `model ${job.model}` : job.workload_label).title = job.workload;
    cell(row, job.target_label).title = job.target;
    cell(row, job.tuner);
    const status = cell(row, job.status, `status-${job.status}`);
    if (job.error) status.append(reason(job.error, "error"));
    if (job.waiting) status.append(reason(waitingFor(job), "waiting"));
    const bar = document.createElement("progress");
    bar.max = job.trials;
    bar.value = job.trials_done;
    cell(row, ` ${job.trials_done}/${job.trials}`).prepend(bar);
    cell(row, fixed(job.best_gflops));
  }
}

function selectJob(job) {
  if (job.id === selected) return;
  selected = job.id;
  numpy = null;
  if (chart) chart.destroy();
  chart = null;
  $("numpy-gflops").textContent = "…";
  if (job.model) return;  // a model's latency has no NumPy reference
  getJson(`/api/jobs/${job.id}/reference`).then((ref) => {
    if (job.id !== selected) return;
    numpy = ref.numpy_gflops;
    $("numpy-gflops").textContent = fixed(numpy);
  });
}

const dots = (color) => ({ show: true, size: 7, fill: color, stroke: color });
const GFLOPS_SERIES = [
  { label: "candidate", stroke: "#3a7bd5", paths: () => null, points: dots("#3a7bd5") },
  { label: "failed", stroke: "#d33", paths: () => null, points: dots("#d33") },
  { label: "best so far", stroke: "#0a6", width: 2, points: { show: false } },
  { label: "NumPy", stroke: "#888", dash: [6, 4], points: { show: false } },
];
const LATENCY_SERIES = [{ label: "estimated model latency", stroke: "#0a6", width: 2, points: { show: false } }];
// Trials are whole: the x ticks step by 1, 2 or 5 × 10^k (uPlot's own steps include 0.1 to 0.5 for a short curve).
const TRIAL_STEPS = [0, 1, 2, 3, 4, 5].flatMap((power) => [1, 2, 5].map((step) => step * 10 ** power));

function makeChart(label, series) {
  return new uPlot({
    width: $("chart").clientWidth, height: 320,
    scales: { x: { time: false } },
    axes: [{ label: "trial", incrs: TRIAL_STEPS }, { label }],
    series: [{ label: "trial" }, ...series],
  }, [[], ...series.map(() => [])], $("chart"));
}

function gflopsData(job) {
  const trials = job.candidates.map((_, i) => i + 1);
  const ok = job.candidates.map((c) => (c.outcome === "ok" ? c.gflops : null));
  const failed = job.candidates.map((c) => (c.outcome === "ok" ? null : 0));
  const reference = trials.map(() => numpy);
  return [trials, ok, failed, job.curve, reference];
}

function renderChart(job, isModel) {
  chart = chart || (isModel ? makeChart("estimated latency (ms)", LATENCY_SERIES) : makeChart("GFLOPS", GFLOPS_SERIES));
  const points = isModel ? job.latency_curve : job.candidates;
  chart.setData(isModel ? [points.map((_, i) => i + 1), points] : gflopsData(job));
  $("chart").dataset.points = points.length;
}

function renderTasks(tasks) {
  const body = $("tasks").tBodies[0];
  body.replaceChildren();
  for (const task of tasks) {
    const row = body.insertRow();
    [task.job_id, task.weight ?? "–", task.workload, task.trials_done, fixed(task.best_gflops),
      task.best_seconds == null ? "–" : (task.best_seconds * 1e6).toFixed(1)].forEach((text) => cell(row, text));
  }
}

function renderJob(job) {
  const isModel = job.tasks.length > 0;
  $("job").hidden = false;
  $("job").classList.toggle("model", isModel);
  $("job-id").textContent = job.id;
  $("job-workload").replaceChildren(
    ...breakingAfterCommas(`${isModel ? `model ${job.model}` : job.workload} on ${job.target} (${job.tuner})`));
  $("job-status").textContent = job.status;
  $("job-status").className = `status-${job.status}`;
  $("job-progress").textContent = `${job.trials_done}/${job.trials}`;
  $("job-error").textContent = job.error;
  $("job-waiting").textContent = waitingFor(job);
  $("best-gflops").textContent = fixed(job.best_gflops);
  $("latency-ms").textContent = job.latency_ms == null ? "–" : job.latency_ms.toPrecision(3);
  $("outcomes").replaceChildren(...Object.entries(job.outcomes).map(([outcome, count]) => {
    const item = document.createElement("li");
    item.textContent = `${outcome}: ${count}`;
    return item;
  }));
  $("best-config").textContent = job.best_config
    ? [`config ${job.best_config.index}`, ...Object.entries(job.best_config.knobs)
      .map(([knob, value]) => `${knob} = ${JSON.stringify(value)}`)].join("\n") : "–";
  $("loop-nest").textContent = job.best_program || "–";
  renderTasks(job.tasks);
  renderChart(job, isModel);
}

// What clients built with no config of their own, and the job tuning each.
function renderRequests(requests) {
  const body = $("requests").tBodies[0];
  body.replaceChildren();
  for (const request of requests) {
    const row = body.insertRow();
    cell(row, request.workload_label).title = request.workload;
    cell(row, request.target_label).title = request.target;
    cell(row, request.times_asked);
    cell(row, new Date(request.last_asked).toLocaleString());
    cell(row, request.job_id ?? "– (queue full)");
    cell(row, request.job_status ?? "–", request.job_status ? `status-${request.job_status}` : "");
  }
}

function renderWorkers(workers) {
  $("workers-host").textContent = `service host ${workers.host} · CPU ${workers.cpu} · pool ${workers.pool || "none"}`;
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const runner of workers.runners) {
    const row = body.insertRow();
    cell(row, runner.name);
    cell(row, workers.host);
    cell(row, runner.busy ? "busy" : "idle", runner.busy ? "status-running" : "");
    cell(row, runner.job_id ?? "–");
    cell(row, runner.candidates);
  }
  $("ray-nodes").hidden = workers.ray_nodes.length === 0;
  const nodes = $("ray-nodes").tBodies[0];
  nodes.replaceChildren();
  for (const node of workers.ray_nodes) {
    const row = nodes.insertRow();
    [node.host, node.address, node.cpus, node.gpus, node.alive ? "yes" : "no"].forEach((text) => cell(row, text));
  }
}

async function refresh() {
  try {
    // the selected job before the list, so that the list is never older than the panel beside it (fetched
    // after the list, a job's panel could say done while its row still showed it running)
    let shown = selected === null ? null : await getJson(`/api/jobs/${selected}`);
    const [jobs, workers, requests] = await Promise.all(
      [getJson("/api/jobs"), getJson("/api/workers"), getJson("/api/requests")]);
    if (selected === null && jobs.length) {
      selectJob(jobs.find((job) => job.status === "running") || jobs[0]);
    }
    renderJobs(jobs);
    renderRequests(requests);
    renderWorkers(workers);
    if (selected !== null) {
      if (shown === null || shown.id !== selected) shown = await getJson(`/api/jobs/${selected}`);
      renderJob(shown);
    }
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("updated").textContent = `update failed: ${error.message}`;
  }
}

refresh();
setInterval(refresh, POLL_MS);
