// Fleet page: the GPU workers, refreshed every 2 s.
"use strict";

(() => {
  const { h } = TC;

  function row(w) {
    const stale = w.heartbeat_age_s > 15;
    return h("tr", { dataset: { worker: w.name } },
      h("td", { class: "mono" }, w.name),
      h("td", {}, w.gpu_model),
      h("td", { class: "num" }, w.sm ? `sm_${w.sm}` : "–"),
      h("td", {}, w.target === "*" ? "any" : w.target),
      h("td", {}, w.backend === "simulated" ? TC.simBadge(true) : w.backend),
      h("td", {}, TC.statusBadge(w.state)),
      h("td", { class: "num" + (stale ? " stale" : "") }, TC.duration(w.heartbeat_age_s) + " ago"),
      h("td", { class: "num" }, `${w.measurements_per_min.toFixed(1)} /min`),
      h("td", { title: w.started_at }, TC.ago(w.started_at)));
  }

  async function refresh() {
    const workers = await TC.api("/workers");
    const live = workers.filter((w) => w.state === "busy" || w.state === "idle");
    const rate = workers.reduce((a, w) => a + w.measurements_per_min, 0);
    const gpus = new Set(live.map((w) => w.gpu_model));
    document.getElementById("fleet-cards").replaceChildren(
      TC.card("Live workers", String(live.length), `${workers.length - live.length} stopped or lost`),
      TC.card("Busy", String(workers.filter((w) => w.state === "busy").length)),
      TC.card("Throughput", `${rate.toFixed(1)} /min`, "measurements, all workers"),
      TC.card("GPU models", String(gpus.size), [...gpus].join(", ") || "–"));
    TC.fillTable(document.getElementById("workers-table"), workers.map(row),
      document.getElementById("workers-empty"));
  }

  TC.poll(refresh, 2000);
})();
