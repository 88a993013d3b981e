// Schedules page: the best verified schedule of every task, filterable, exportable as the
// API's JSON lines (filtered the same way as the table).
"use strict";

(() => {
  const { h } = TC;
  const fTarget = document.getElementById("f-target");
  const fPrecision = document.getElementById("f-precision");
  const fText = document.getElementById("f-text");
  let all = [];

  const knobs = (s) => Object.entries(s).map(([k, v]) => `${k}=${v}`).join(" ");

  function matches(row) {
    const t = row.task;
    const text = fText.value.trim().toLowerCase();
    return (!fTarget.value || t.target === fTarget.value) &&
      (!fPrecision.value || t.precision === fPrecision.value) &&
      (!text || (TC.shape(t.shape) + " " + t.key).toLowerCase().includes(text));
  }

  function row(r) {
    const t = r.task;
    const sp = r.speedup;
    const timed = t.baseline_backend ? `${t.baseline}, ${t.baseline_backend}` : `${t.baseline}, not timed yet`;
    return h("tr", { dataset: { taskKey: t.key } },
      h("td", { class: "mono", title: t.key }, TC.shape(t.shape)),
      h("td", {}, t.precision),
      h("td", {}, t.target),
      h("td", { class: "num best" }, TC.us(r.latency_us), " ", TC.simBadge(r.simulated, r.simulated_note)),
      h("td", { class: "num baseline", title: timed }, TC.us(t.baseline_us),
        t.baseline_us ? h("span", { class: "muted small" }, ` ${t.baseline}`) : null),
      h("td", { class: "num speedup" + (sp >= 1 ? " good" : ""), title: `against ${t.baseline}` }, TC.speedup(sp)),
      h("td", {}, h("a", { href: `/ui/jobs/${r.job_id}` }, `#${r.job_id}`)),
      h("td", { title: r.measured_at }, TC.ago(r.measured_at)),
      h("td", { class: "mono small knobs", title: JSON.stringify(r.schedule, null, 1) }, knobs(r.schedule)));
  }

  // Keep the select options in step with the data, preserving the current choice.
  function options(select, values) {
    const current = select.value;
    const want = ["", ...[...new Set(values)].sort()];
    const have = [...select.options].map((o) => o.value);
    if (want.join("|") === have.join("|")) return;
    select.replaceChildren(...want.map((v) => h("option", { value: v }, v || "all")));
    select.value = want.includes(current) ? current : "";
  }

  function render() {
    const shown = all.filter(matches);
    TC.fillTable(document.getElementById("schedules-table"), shown.map(row),
      document.getElementById("schedules-empty"));
    document.getElementById("sched-count").textContent =
      `${shown.length} of ${all.length} tasks with a verified schedule`;
    return shown;
  }

  async function refresh() {
    all = await TC.api("/schedules");
    options(fTarget, all.map((r) => r.task.target));
    options(fPrecision, all.map((r) => r.task.precision));
    render();
  }

  async function exportJsonl() {
    const params = new URLSearchParams({ format: "jsonl" });
    if (fTarget.value) params.set("target", fTarget.value);
    if (fPrecision.value) params.set("precision", fPrecision.value);
    let text = await TC.api(`/schedules?${params}`, { as: "text" });
    if (fText.value.trim()) {
      const keys = new Set(render().map((r) => r.task.key));
      text = text.split("\n").filter((l) => l && keys.has(JSON.parse(l).task.key))
        .map((l) => l + "\n").join("");
    }
    const name = ["schedules", fTarget.value, fPrecision.value].filter(Boolean).join("-");
    TC.download(new Blob([text], { type: "application/x-ndjson" }), `${name}.jsonl`);
  }

  for (const el of [fTarget, fPrecision]) el.addEventListener("change", render);
  fText.addEventListener("input", render);
  document.getElementById("export").addEventListener("click", () => {
    exportJsonl().catch((err) => TC.banner(`Export failed: ${err.message}`));
  });
  TC.poll(refresh, 5000);
})();
