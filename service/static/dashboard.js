// The dashboard: polls the REST API once a second and redraws jobs, the selected job's chart and the workers.
"use strict";

const POLL_MS = 1000;
let selected = null;   // the job id shown in detail; null picks the newest running (or newest) job
let chart = null;      // the uPlot chart of the selected job
let numpy = null;      // NumPy's GFLOPS for the selected job's workload

const $ = (id) => document.getElementById(id);

async function getJson(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fixed(value) { return value == null ? "–" : value.toFixed(1); }

function renderJobs(jobs) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const job of jobs) {
    const row = body.insertRow();
    row.dataset.id = job.id;
    row.classList.toggle("selected", job.id === selected);
    row.onclick = () => { selectJob(job.id); refresh(); };
    cell(row, job.id);
    cell(row, job.workload);
    cell(row, job.target);
    cell(row, job.tuner);
    cell(row, job.status, `status-${job.status}`);
    const bar = document.createElement("progress");
    bar.max = job.trials;
    bar.value = job.trials_done;
    cell(row, ` ${job.trials_done}/${job.trials}`).prepend(bar);
    cell(row, fixed(job.best_gflops));
  }
}

function selectJob(id) {
  if (id === selected) return;
  selected = id;
  numpy = null;
  if (chart) chart.destroy();
  chart = null;
  $("numpy-gflops").textContent = "…";
  getJson(`/api/jobs/${id}/reference`).then((ref) => {
    if (id !== selected) return;
    numpy = ref.numpy_gflops;
    $("numpy-gflops").textContent = fixed(numpy);
  });
}

function chartData(job) {
  const trials = job.candidates.map((_, i) => i + 1);
  const ok = job.candidates.map((c) => (c.outcome === "ok" ? c.gflops : null));
  const failed = job.candidates.map((c) => (c.outcome === "ok" ? null : 0));
  const reference = trials.map(() => numpy);
  return [trials, ok, failed, job.curve, reference];
}

function makeChart() {
  const dots = (color) => ({ show: true, size: 7, fill: color, stroke: color });
  return new uPlot({
    width: $("chart").clientWidth, height: 320,
    scales: { x: { time: false } },
    axes: [{ label: "trial" }, { label: "GFLOPS" }],
    series: [
      { label: "trial" },
      { label: "candidate", stroke: "#3a7bd5", paths: () => null, points: dots("#3a7bd5") },
      { label: "failed", stroke: "#d33", paths: () => null, points: dots("#d33") },
      { label: "best so far", stroke: "#0a6", width: 2, points: { show: false } },
      { label: "NumPy", stroke: "#888", dash: [6, 4], points: { show: false } },
    ],
  }, [[], [], [], [], []], $("chart"));
}

function renderJob(job) {
  $("job").hidden = false;
  $("job-id").textContent = job.id;
  $("job-workload").textContent = `${job.workload} on ${job.target} (${job.tuner})`;
  $("job-status").textContent = job.status;
  $("job-status").className = `status-${job.status}`;
  $("job-progress").textContent = `${job.trials_done}/${job.trials}`;
  $("job-error").textContent = job.error;
  $("best-gflops").textContent = fixed(job.best_gflops);
  $("outcomes").replaceChildren(...Object.entries(job.outcomes).map(([outcome, count]) => {
    const item = document.createElement("li");
    item.textContent = `${outcome}: ${count}`;
    return item;
  }));
  $("best-config").textContent = job.best_config
    ? [`config ${job.best_config.index}`, ...Object.entries(job.best_config.knobs)
      .map(([knob, value]) => `${knob} = ${JSON.stringify(value)}`)].join("\n") : "–";
  $("loop-nest").textContent = job.best_program || "–";
  chart = chart || makeChart();
  chart.setData(chartData(job));
  $("chart").dataset.points = job.candidates.length;
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
    const [jobs, workers] = await Promise.all([getJson("/api/jobs"), getJson("/api/workers")]);
    if (selected === null && jobs.length) {
      selectJob((jobs.find((job) => job.status === "running") || jobs[0]).id);
    }
    renderJobs(jobs);
    renderWorkers(workers);
    if (selected !== null) renderJob(await getJson(`/api/jobs/${selected}`));
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("updated").textContent = `update failed: ${error.message}`;
  }
}

refresh();
setInterval(refresh, POLL_MS);
