// Jobs page: every job with its progress, refreshed every 2 s.
"use strict";

(() => {
  const { h } = TC;
  const table = document.getElementById("jobs-table");
  const filter = document.getElementById("status-filter");
  let poller = null;

  function row(job) {
    const t = job.task;
    const href = `/ui/jobs/${job.id}`;
    const base = t.baseline_us
      ? h("span", { title: `${t.baseline} (${t.baseline_backend || "?"})` }, TC.us(t.baseline_us)) : "–";
    return h("tr", { class: "clickable", dataset: { jobId: job.id, href }, onclick: () => { window.location.href = href; } },
      h("td", {}, h("a", { href }, `#${job.id}`)),
      h("td", { class: "mono", title: t.key }, TC.shape(t.shape)),
      h("td", {}, t.precision),
      h("td", {}, t.target),
      h("td", {}, TC.statusBadge(job.status)),
      h("td", {}, TC.progress(job.trials_done, job.trials)),
      h("td", { class: "num best" }, TC.us(job.best_us), " ", TC.simBadge(job.simulated, job.simulated_note)),
      h("td", { class: "num" }, base),
      h("td", { class: "num speedup" + (job.speedup >= 1 ? " good" : "") }, h("span", { title: `against ${t.baseline}` }, TC.speedup(job.speedup))),
      h("td", {}, job.strategy),
      h("td", { title: job.created_at }, TC.ago(job.created_at)));
  }

  function cards(jobs) {
    const count = (s) => jobs.filter((j) => j.status === s).length;
    const speedups = jobs.map((j) => j.speedup).filter((x) => x);
    const best = speedups.length ? Math.max(...speedups) : null;
    return [
      TC.card("Running", String(count("running")), `${count("queued")} queued`),
      TC.card("Done", String(count("done")), `${count("failed")} failed`),
      TC.card("Trials measured", String(jobs.reduce((a, j) => a + j.trials_done, 0))),
      TC.card("Best speedup", TC.speedup(best), "over its task's baseline (cuDNN fp16; fp32 for fp32_tc)"),
    ];
  }

  async function refresh() {
    const q = filter.value ? `?status=${encodeURIComponent(filter.value)}` : "";
    const jobs = await TC.api(`/jobs${q}`);
    document.getElementById("job-cards").replaceChildren(...cards(jobs));
    TC.fillTable(table, jobs.map(row), document.getElementById("jobs-empty"));
  }

  filter.addEventListener("change", () => { poller.stop(); poller = TC.poll(refresh, 2000); });
  poller = TC.poll(refresh, 2000);
})();
