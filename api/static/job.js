// Job page: one tuning job, updated live by polling GET /jobs/{id}?after=N, which returns
// only the measurements newer than the last one seen (the page never reloads).
"use strict";

(() => {
  const { h } = TC;
  const root = document.getElementById("job-root");
  const jobId = Number(root.dataset.jobId);
  const ACTIVE = new Set(["queued", "running"]);
  const STATUS_ORDER = ["ok", "wrong", "compile_error", "runtime_error", "timeout"];
  const TOP_N = 30;
  const GL_ABOVE = 4000; // more markers than SVG redraws smoothly every second: use WebGL

  const state = { job: null, ms: [], after: 0, parcoordsKey: "", drawnCount: -1 };

  const FONT = { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 12, color: "#26323d" };
  const CONFIG = { displaylogo: false, responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d"] };
  const base = (extra) => ({
    font: FONT, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
    margin: { l: 64, r: 18, t: 12, b: 46 }, hovermode: "closest",
    hoverlabel: { font: { family: FONT.family, size: 12 } }, ...extra,
  });
  const axis = (title, extra) => ({
    title: { text: title, standoff: 8 }, gridcolor: "#e9edf1", zerolinecolor: "#d5dbe1",
    linecolor: "#c9d1d9", automargin: true, ...extra,
  });

  // Log axes with readable ticks: Plotly's own label 20 and 30 as "2" and "3" on short ranges.
  function logTicks(lo, hi) {
    const fmt = (v) => String(Number(v.toPrecision(3)));
    for (const mant of [[1, 2, 5], [1, 2, 3, 5, 7], [1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9]]) {
      const vals = [];
      for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
        for (const m of mant) {
          const v = m * 10 ** e;
          if (v >= lo && v <= hi) vals.push(v);
        }
      }
      if (vals.length >= 4 || mant.length > 5) return { tickmode: "array", tickvals: vals, ticktext: vals.map(fmt) };
    }
    return {};
  }

  function logAxis(title, lo, hi) {
    return axis(title, { type: "log", range: [Math.log10(lo), Math.log10(hi)], ...logTicks(lo, hi) });
  }

  // --- chart containers: a Plotly chart or a short explanation, never an empty box ---------

  function placeholder(div, text) {
    if (div.data) Plotly.purge(div);
    div.replaceChildren(h("p", { class: "placeholder" }, text));
  }

  function plot(div, data, layout, config) {
    if (!div.data) div.replaceChildren();
    return Plotly.react(div, data, layout, { ...CONFIG, ...config });
  }

  const hasWebGL = (() => {
    try { return !!document.createElement("canvas").getContext("webgl"); } catch (_) { return false; }
  })();

  // --- data ---------------------------------------------------------------------------------

  const okMs = () => state.ms.filter((m) => m.status === "ok" && m.median_us !== null);

  function best() {
    let b = null;
    for (const m of okMs()) if (!b || m.median_us < b.median_us) b = m;
    return b;
  }

  function knobText(s) {
    return Object.entries(s).map(([k, v]) => `${k}=${v}`).join("<br>");
  }

  // Horizontal reference lines: the cuDNN baseline (and, for int8, the project's goal of
  // half of it), plus any other named baselines the task may carry.
  function baselines(task) {
    const lines = [];
    if (task.baseline_us) {
      const sim = task.baseline_backend === "simulated" ? ", simulated" : "";
      lines.push({ name: `${task.baseline}${sim}`, y: task.baseline_us, dash: "dash", color: "#495057" });
      if (task.precision === "int8") {
        lines.push({ name: `goal: ½ × ${task.baseline}`, y: task.baseline_us / 2, dash: "dot", color: "#868e96" });
      }
    }
    if (task.baselines && typeof task.baselines === "object") {
      for (const [name, y] of Object.entries(task.baselines)) {
        if (typeof y === "number") lines.push({ name, y, dash: "dashdot", color: "#adb5bd" });
      }
    }
    return lines;
  }

  // --- charts -------------------------------------------------------------------------------

  function latencyChart() {
    const div = document.getElementById("chart-latency");
    const job = state.job;
    if (!state.ms.length) {
      placeholder(div, ACTIVE.has(job.status) ? "Waiting for the first measurements…" : "No measurements.");
      return;
    }
    const ok = okMs();
    const maxOk = ok.length ? Math.max(...ok.map((m) => m.median_us)) : (job.task.baseline_us || 10);
    const failY = maxOk * 1.35; // failed candidates have no latency: drawn on a band above
    const groups = new Map();
    for (const m of state.ms) {
      if (!groups.has(m.status)) groups.set(m.status, []);
      groups.get(m.status).push(m);
    }
    const order = [...groups.keys()].sort((a, b) =>
      (STATUS_ORDER.indexOf(a) + 1 || 99) - (STATUS_ORDER.indexOf(b) + 1 || 99));
    const markerType = state.ms.length > GL_ABOVE && hasWebGL ? "scattergl" : "scatter";
    const traces = order.map((status) => {
      const ms = groups.get(status);
      return {
        type: markerType, mode: "markers", name: status,
        x: ms.map((m) => m.trial), y: ms.map((m) => m.median_us ?? failY),
        marker: { color: TC.STATUS_COLORS[status] || "#868e96", size: 6,
          symbol: status === "ok" ? "circle" : "x", opacity: status === "ok" ? 0.7 : 0.9 },
        text: ms.map((m) => `trial ${m.trial} · ${m.status}<br>` +
          (m.median_us !== null ? `${TC.us(m.median_us)} (IQR ${TC.us(m.iqr_us)})<br>` : "") +
          (m.predicted_us !== null ? `predicted ${TC.us(m.predicted_us)}<br>` : "") +
          (m.error ? `${String(m.error).slice(0, 80)}<br>` : "") + knobText(m.schedule)),
        hovertemplate: "%{text}<extra></extra>",
      };
    });
    // Best so far: a step line over the verified (ok) measurements in trial order.
    const bx = [];
    const by = [];
    let cur = Infinity;
    for (const m of ok) {
      if (m.median_us < cur) { cur = m.median_us; }
      bx.push(m.trial);
      by.push(cur);
    }
    traces.push({ type: "scatter", mode: "lines", name: "best so far", x: bx, y: by,
      line: { shape: "hv", color: "#1f6f5c", width: 2.5 }, hovertemplate: "best %{y:.3f} µs after %{x} trials<extra></extra>" });
    const xmax = Math.max(job.trials, state.ms[state.ms.length - 1].trial) + 1;
    const lines = baselines(job.task);
    const ys = [...traces.flatMap((t) => t.y), ...lines.map((b) => b.y)].filter((y) => y > 0);
    const ylo = Math.min(...ys) / 1.15;
    const yhi = Math.max(...ys) * 1.15;
    for (const b of lines) {
      traces.push({ type: "scatter", mode: "lines", name: b.name, x: [0, xmax], y: [b.y, b.y],
        line: { dash: b.dash, color: b.color, width: 1.5 }, hovertemplate: `${b.name}: %{y:.3f} µs<extra></extra>` });
    }
    const failed = state.ms.some((m) => m.median_us === null);
    plot(div, traces, base({
      annotations: failed ? [{ xref: "paper", x: 1, y: Math.log10(failY), xanchor: "right",
        yanchor: "bottom", showarrow: false, text: "failed: no latency",
        font: { size: 11, color: "#868e96" } }] : [],
      xaxis: axis("trial", { range: [0, xmax] }),
      yaxis: logAxis("latency (µs, log)", ylo, yhi),
      legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 0, bgcolor: "rgba(0,0,0,0)" },
      margin: { l: 64, r: 18, t: 36, b: 46 },
    }));
  }

  // Spearman rank correlation, to say in one number how well the model orders schedules.
  function spearman(xs, ys) {
    const rank = (v) => {
      const idx = v.map((x, i) => [x, i]).sort((a, b) => a[0] - b[0]);
      const r = new Array(v.length);
      idx.forEach(([, i], k) => { r[i] = k; });
      return r;
    };
    const rx = rank(xs);
    const ry = rank(ys);
    const n = xs.length;
    const mean = (n - 1) / 2;
    let num = 0; let dx = 0; let dy = 0;
    for (let i = 0; i < n; i++) {
      num += (rx[i] - mean) * (ry[i] - mean);
      dx += (rx[i] - mean) ** 2;
      dy += (ry[i] - mean) ** 2;
    }
    return dx && dy ? num / Math.sqrt(dx * dy) : null;
  }

  function predictionChart() {
    const div = document.getElementById("chart-pred");
    const pts = state.ms.filter((m) => m.predicted_us !== null && m.median_us !== null);
    if (!pts.length) {
      placeholder(div, `No cost-model predictions for this job yet (strategy “${state.job.strategy}”): ` +
        "model-based strategies predict each candidate before it is measured.");
      return;
    }
    const all = pts.flatMap((m) => [m.predicted_us, m.median_us]);
    const lo = Math.min(...all) * 0.9;
    const hi = Math.max(...all) * 1.1;
    const rho = pts.length >= 3 ? spearman(pts.map((m) => m.predicted_us), pts.map((m) => m.median_us)) : null;
    plot(div, [
      { type: "scatter", mode: "lines", x: [lo, hi], y: [lo, hi], name: "y = x", showlegend: false,
        line: { color: "#adb5bd", dash: "dot" }, hoverinfo: "skip" },
      { type: "scatter", mode: "markers", name: "measured", x: pts.map((m) => m.predicted_us),
        y: pts.map((m) => m.median_us), text: pts.map((m) => m.trial),
        marker: { color: pts.map((m) => m.trial), colorscale: "Viridis", size: 7, opacity: 0.8,
          colorbar: { title: { text: "trial" }, thickness: 10, len: 0.8 } },
        hovertemplate: "trial %{text}<br>predicted %{x:.3f} µs<br>measured %{y:.3f} µs<extra></extra>" },
    ], base({
      xaxis: logAxis("predicted (µs, log)", lo, hi),
      yaxis: logAxis("measured (µs, log)", lo, hi),
      showlegend: false,
      annotations: rho === null ? [] : [{ xref: "paper", yref: "paper", x: 0.02, y: 0.98, showarrow: false,
        xanchor: "left", yanchor: "top", text: `Spearman ρ = ${rho.toFixed(2)} (n = ${pts.length})`,
        bgcolor: "rgba(255,255,255,0.85)", font: { size: 12 } }],
    }), { displayModeBar: false });
  }

  // Share of the variance of log latency that each knob explains on its own (eta squared):
  // a model-free stand-in until the cost model reports its own importances.
  function importanceFromMeasurements(ok) {
    const ys = ok.map((m) => Math.log(m.median_us));
    const mean = ys.reduce((a, b) => a + b, 0) / ys.length;
    const total = ys.reduce((a, y) => a + (y - mean) ** 2, 0);
    if (!total) return {};
    const out = {};
    for (const knob of Object.keys(ok[0].schedule)) {
      const groups = new Map();
      ok.forEach((m, i) => {
        const key = String(m.schedule[knob]);
        const g = groups.get(key) || { n: 0, sum: 0 };
        g.n += 1; g.sum += ys[i];
        groups.set(key, g);
      });
      let between = 0;
      for (const g of groups.values()) between += g.n * (g.sum / g.n - mean) ** 2;
      out[knob] = between / total;
    }
    return out;
  }

  function importanceChart() {
    const div = document.getElementById("chart-importance");
    const src = document.getElementById("importance-source");
    const fromModel = state.job.insight && state.job.insight.knob_importance;
    let imp = null;
    if (fromModel && typeof fromModel === "object" && Object.keys(fromModel).length) {
      imp = fromModel;
      src.textContent = "from the cost model";
    } else {
      const ok = okMs();
      if (ok.length < 8) {
        src.textContent = "";
        placeholder(div, "Needs the cost model's importances or at least 8 verified measurements.");
        return;
      }
      imp = importanceFromMeasurements(ok);
      src.textContent = "share of the variance of log latency that each knob explains alone " +
        "(from the measurements; the cost model reports none yet)";
    }
    const items = Object.entries(imp).filter(([, v]) => typeof v === "number").sort((a, b) => a[1] - b[1]);
    plot(div, [{ type: "bar", orientation: "h", x: items.map((e) => e[1]), y: items.map((e) => e[0]),
      marker: { color: "#3b7dd8" }, hovertemplate: "%{y}: %{x:.3f}<extra></extra>" }],
    base({ xaxis: axis("importance", { rangemode: "tozero" }), yaxis: axis("", { automargin: true }),
      margin: { l: 120, r: 18, t: 4, b: 46 } }), { displayModeBar: false });
  }

  function parcoordsChart() {
    const div = document.getElementById("chart-parcoords");
    const hint = document.getElementById("parcoords-hint");
    const top = okMs().sort((a, b) => a.median_us - b.median_us).slice(0, TOP_N);
    hint.textContent = top.length
      ? `the ${top.length} fastest verified schedules, brighter = faster; drag along an axis to filter` : "";
    if (top.length < 2) {
      state.parcoordsKey = "";
      placeholder(div, "Needs at least two verified schedules.");
      return;
    }
    if (!hasWebGL) {
      placeholder(div, "Parallel coordinates need WebGL, which this browser does not offer.");
      return;
    }
    const key = top.map((m) => m.id).join(",");
    if (key === state.parcoordsKey) return; // WebGL redraws are costly: only when the set changes
    state.parcoordsKey = key;
    // Axis ticks from every value the job has tried, so an axis shows the explored range. A
    // knob the job never varied says nothing here: no axis for it (fewer, wider-spaced labels).
    const varied = Object.keys(top[0].schedule)
      .filter((knob) => new Set(state.ms.map((m) => m.schedule[knob])).size > 1);
    const dims = varied.map((knob) => {
      const seen = [...new Set(state.ms.map((m) => m.schedule[knob]))];
      const numeric = seen.every((v) => typeof v === "number");
      seen.sort((a, b) => (numeric ? a - b : String(a).localeCompare(String(b))));
      const index = new Map(seen.map((v, i) => [v, i]));
      return numeric
        ? { label: knob, values: top.map((m) => m.schedule[knob]), tickvals: seen,
          range: [Math.min(...seen), Math.max(...seen)] }
        : { label: knob, values: top.map((m) => index.get(m.schedule[knob])),
          tickvals: seen.map((_, i) => i), ticktext: seen.map(String), range: [0, Math.max(1, seen.length - 1)] };
    });
    const lat = top.map((m) => m.median_us);
    dims.push({ label: "latency µs", values: lat });
    plot(div, [{ type: "parcoords", dimensions: dims,
      line: { color: lat, colorscale: "Viridis", reversescale: true },
      // Labels slanted steeply enough that long knob names clear their neighbours.
      labelangle: -45, labelside: "top", labelfont: { size: 10 }, tickfont: { size: 10 } }],
    base({ margin: { l: 60, r: 90, t: 110, b: 24 } }), { displayModeBar: false });
  }

  // --- header, cards, best schedule -----------------------------------------------------------

  function header() {
    const job = state.job;
    const t = job.task;
    const st = document.getElementById("job-status");
    st.textContent = job.status;
    st.className = `badge st-${job.status}`;
    const sim = document.getElementById("job-sim");
    sim.hidden = !job.simulated;
    sim.textContent = job.simulated_note ? "simulated, unchecked" : "simulated";
    sim.title = job.simulated_note || "measured by the analytical model, not a GPU";
    document.getElementById("job-layer").replaceChildren(
      h("span", { class: "mono" }, TC.shape(t.shape)), ` · ${t.precision} · ${t.target} · `,
      `strategy ${job.strategy}, seed ${job.seed}`);
    const pct = job.trials ? Math.min(100, (100 * job.trials_done) / job.trials) : 0;
    document.getElementById("job-bar").style.width = `${pct.toFixed(1)}%`;
    document.getElementById("job-trials").textContent = `${job.trials_done} / ${job.trials} trials`;
    const warn = document.getElementById("job-warning");
    const text = job.warning || (job.error ? `error: ${job.error}` : "") || job.simulated_note || "";
    warn.textContent = text;
    warn.hidden = !text;
    document.title = `Job ${job.id} (${job.status}) · tctune`;

    const counts = {};
    for (const m of state.ms) counts[m.status] = (counts[m.status] || 0) + 1;
    const failed = state.ms.length - (counts.ok || 0);
    const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
    const elapsed = job.started_at ? (end - Date.parse(job.started_at)) / 1000 : null;
    const rate = elapsed ? (60 * job.trials_done) / elapsed : null;
    document.getElementById("job-cards").replaceChildren(
      TC.card("Best latency", TC.us(job.best_us), TC.simBadge(job.simulated, job.simulated_note)),
      TC.card(`${t.baseline} baseline`, TC.us(t.baseline_us), t.baseline_backend || "not timed yet"),
      TC.card("Speedup", TC.speedup(job.speedup), `${t.baseline} / best`),
      TC.card("Failed candidates", String(failed),
        Object.entries(counts).filter(([s]) => s !== "ok").map(([s, n]) => `${n} ${s}`).join(", ") || "none"),
      TC.card("Elapsed", elapsed === null ? "–" : TC.duration(elapsed),
        rate === null ? "" : `${rate.toFixed(0)} trials/min`));
  }

  function bestPanel() {
    const b = best();
    const pre = document.getElementById("best-schedule");
    const btn = document.getElementById("copy-best");
    const t = state.job.task;
    document.getElementById("best-cli").textContent =
      `tctune schedule --shape ${TC.shapeArg(t.shape)} --precision ${t.precision} --target ${t.target}`;
    if (!b) {
      pre.textContent = "no verified schedule yet";
      btn.disabled = true;
      return;
    }
    const text = JSON.stringify(b.schedule, null, 2);
    if (pre.textContent !== text) pre.textContent = text;
    pre.dataset.trial = b.trial;
    btn.disabled = false;
    document.getElementById("best-meta").textContent =
      `${TC.us(b.median_us)} (IQR ${TC.us(b.iqr_us)}) at trial ${b.trial}` +
      (b.worker ? ` on ${b.worker}` : "") + (b.simulated ? " · simulated" : "");
  }

  document.getElementById("copy-best").addEventListener("click", async (ev) => {
    const btn = ev.currentTarget;
    const ok = await TC.copyText(document.getElementById("best-schedule").textContent);
    btn.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { btn.textContent = "Copy"; }, 1500);
  });

  // --- polling --------------------------------------------------------------------------------

  async function refresh() {
    let job;
    try {
      job = await TC.api(`/jobs/${jobId}?after=${state.after}`);
    } catch (err) {
      if (err.status === 404) {
        root.replaceChildren(h("p", { class: "empty" }, `No job ${jobId}. `, h("a", { href: "/" }, "All jobs")));
        return false;
      }
      throw err;
    }
    const fresh = job.measurements;
    delete job.measurements;
    const statusChanged = !state.job || state.job.status !== job.status;
    const insightChanged = JSON.stringify(state.job && state.job.insight) !== JSON.stringify(job.insight);
    state.job = job;
    state.ms.push(...fresh);
    state.after = job.next_after;
    header();
    if (fresh.length || statusChanged || insightChanged || state.drawnCount < 0) {
      state.drawnCount = state.ms.length;
      latencyChart();
      predictionChart();
      importanceChart();
      parcoordsChart();
      bestPanel();
    }
    root.dataset.measurements = String(state.ms.length);
    return ACTIVE.has(job.status); // a finished job stops polling
  }

  TC.poll(refresh, 1000);
})();
