// Shared helpers of the tctune dashboard pages: API access (with an optional bearer token),
// polling, formatting and small DOM builders. Plain browser JavaScript, no build step.
"use strict";

const TC = (() => {
  const TOKEN_KEY = "tctune.token";

  // A token passed as ?token= is kept in localStorage and removed from the address bar, so
  // it does not end up in bookmarks, history or screenshots.
  function initToken() {
    const url = new URL(window.location.href);
    const given = url.searchParams.get("token");
    if (given !== null) {
      if (given) localStorage.setItem(TOKEN_KEY, given);
      else localStorage.removeItem(TOKEN_KEY);
      url.searchParams.delete("token");
      history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  function token() {
    return localStorage.getItem(TOKEN_KEY) || "";
  }

  function authHeaders() {
    const t = token();
    return t ? { Authorization: "Bearer " + t } : {};
  }

  class AuthError extends Error {}

  // fetch() against the API; `as` is "json" (default), "text" or "blob".
  async function api(path, { as = "json" } = {}) {
    const resp = await fetch(path, { headers: { Accept: "application/json", ...authHeaders() } });
    if (resp.status === 401 || resp.status === 403) {
      let detail = "";
      try { detail = (await resp.json()).detail || ""; } catch (_) { /* not JSON */ }
      showTokenForm(detail);
      throw new AuthError(detail || "the service needs a token");
    }
    if (!resp.ok) {
      let detail = resp.statusText;
      try { detail = (await resp.json()).detail || detail; } catch (_) { /* not JSON */ }
      const err = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
      err.status = resp.status;
      throw err;
    }
    if (as === "blob") return resp.blob();
    if (as === "text") return resp.text();
    return resp.json();
  }

  function showTokenForm(detail) {
    const form = document.getElementById("token-form");
    if (!form.hidden) return;
    if (token()) {
      document.querySelector("#token-form label").textContent =
        `The saved token was refused (${detail || "unauthorized"}). Enter another:`;
    }
    form.hidden = false;
    form.onsubmit = (ev) => {
      ev.preventDefault();
      const value = document.getElementById("token-input").value.trim();
      if (value) localStorage.setItem(TOKEN_KEY, value);
      window.location.reload();
    };
  }

  function banner(text) {
    const el = document.getElementById("banner");
    el.textContent = text || "";
    el.hidden = !text;
  }

  // Run `fn` now and then every `ms` after it finishes (never two at once). Failures back
  // off up to 30 s and show a banner; polling pauses while the tab is hidden.
  function poll(fn, ms) {
    let timer = null;
    let stopped = false;
    let failures = 0;
    async function tick() {
      timer = null;
      if (stopped) return;
      if (document.hidden) return; // resumed by visibilitychange
      try {
        const again = await fn();
        failures = 0;
        banner("");
        if (again === false) { stopped = true; return; }
      } catch (err) {
        if (err instanceof AuthError) { stopped = true; return; }
        failures += 1;
        banner(`Cannot reach the service (${err.message}); retrying…`);
      }
      if (!stopped) timer = setTimeout(tick, Math.min(ms * 2 ** failures, 30000));
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && !stopped && timer === null) tick();
    });
    tick();
    return { stop() { stopped = true; if (timer) clearTimeout(timer); } };
  }

  // --- formatting -------------------------------------------------------------------------

  function us(x) {
    if (x === null || x === undefined) return "–";
    if (x >= 1000) return (x / 1000).toFixed(x >= 10000 ? 1 : 2) + " ms";
    return (x >= 100 ? x.toFixed(1) : x >= 10 ? x.toFixed(2) : x.toFixed(3)) + " µs";
  }

  function speedup(x) {
    return x === null || x === undefined ? "–" : x.toFixed(2) + "×";
  }

  function ago(iso) {
    if (!iso) return "–";
    return duration((Date.now() - Date.parse(iso)) / 1000) + " ago";
  }

  // Rounded once to the unit shown, then split: rounding the parts ("19 min 59.6 s") would
  // show "19 min 60 s".
  function duration(s) {
    s = Math.max(0, s);
    if (s < 9.95) return s.toFixed(1) + " s";
    if (s < 59.5) return Math.round(s) + " s";
    const secs = Math.round(s);
    if (secs < 3600) return Math.floor(secs / 60) + " min " + (secs % 60) + " s";
    const mins = Math.round(s / 60);
    if (mins < 1440) return Math.floor(mins / 60) + " h " + (mins % 60) + " min";
    return Math.floor(s / 86400) + " d";
  }

  const pair = (p) => (Array.isArray(p) ? (p[0] === p[1] ? String(p[0]) : p.join("×")) : String(p));
  const isOne = (p, v) => (Array.isArray(p) ? p.every((x) => x === v) : p === v);

  // "n8 56×56 c64→k64 3×3 pad 1" (stride and dilation only when not 1; a layer over two
  // inputs and one that adds a residual say so).
  function shape(s) {
    if (!s) return "";
    let out = `n${s.n} ${s.h}×${s.w} c${s.c}→k${s.k} ${s.r}×${s.s}`;
    if (s.stride && !isOne(s.stride, 1)) out += ` stride ${pair(s.stride)}`;
    if (s.pad && !isOne(s.pad, 0)) out += ` pad ${pair(s.pad)}`;
    if (s.dilation && !isOne(s.dilation, 1)) out += ` dil ${pair(s.dilation)}`;
    if (s.concat) out += ` two inputs (x1 c${s.concat})`;
    if (s.residual) out += " +residual";
    return out;
  }

  // `--shape` argument of the CLI for a task shape.
  function shapeArg(s) {
    const p = (v) => (Array.isArray(v) ? (v[0] === v[1] ? v[0] : v.join("x")) : v);
    return `n=${s.n},h=${s.h},w=${s.w},c=${s.c},k=${s.k},r=${s.r},s=${s.s}` +
      `,stride=${p(s.stride)},pad=${p(s.pad)},dilation=${p(s.dilation)}` +
      (s.concat ? `,concat=${s.concat}` : "") + (s.residual ? ",residual=1" : "");
  }

  // --- DOM --------------------------------------------------------------------------------

  // h("td", {class: "num"}, "text", child...): text is always set as text, never as HTML.
  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function statusBadge(status) {
    return h("span", { class: `badge st-${status}` }, status);
  }

  // A simulated result's badge; `note` (the API's simulated_note): a prediction for a GPU the
  // model was never checked against, shown as the badge's text and title.
  function simBadge(simulated, note) {
    if (!simulated) return null;
    return note
      ? h("span", { class: "badge sim unchecked", title: note }, "simulated, unchecked")
      : h("span", { class: "badge sim", title: "measured by the analytical model, not a GPU" }, "simulated");
  }

  function progress(done, total) {
    const pct = total ? Math.min(100, (100 * done) / total) : 0;
    return h("div", { class: "progress", title: `${done} of ${total} trials` },
      h("div", { class: "bar", style: `width:${pct.toFixed(1)}%` }),
      h("span", { class: "label" }, `${done} / ${total}`));
  }

  function card(label, value, extra) {
    return h("div", { class: "card" }, h("div", { class: "card-label" }, label),
      h("div", { class: "card-value" }, value), extra ? h("div", { class: "card-extra" }, extra) : null);
  }

  // Replace a table body's rows in one go (keeps scroll position, no flicker).
  function fillTable(table, rows, emptyEl) {
    table.tBodies[0].replaceChildren(...rows);
    if (emptyEl) emptyEl.hidden = rows.length > 0;
  }

  // Copy with the Clipboard API where allowed (secure contexts), else the old textarea way.
  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try { await navigator.clipboard.writeText(text); return true; } catch (_) { /* fall back */ }
    }
    const area = h("textarea", { style: "position:fixed;top:-1000px", readonly: true });
    area.value = text;
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (_) { ok = false; }
    area.remove();
    return ok;
  }

  // Save a Blob as a file (used for exports that need the Authorization header).
  function download(blob, filename) {
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: filename, style: "display:none" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // Measurement status colours, shared by the charts and the legend.
  const STATUS_COLORS = {
    ok: "#2b8a6e", wrong: "#d9480f", compile_error: "#7048e8",
    runtime_error: "#c2255c", timeout: "#e8a317",
  };

  async function health() {
    const el = document.getElementById("health");
    try {
      const hz = await api("/healthz");
      el.textContent = `${hz.mode} · ${hz.database} · v${hz.version}`;
      el.className = "health ok";
    } catch (err) {
      el.textContent = err instanceof AuthError ? "token needed" : "unreachable";
      el.className = "health bad";
    }
  }

  initToken();
  document.addEventListener("DOMContentLoaded", health);

  return {
    api, poll, banner, token, authHeaders, AuthError, us, speedup, ago, duration, shape,
    shapeArg, h, statusBadge, simBadge, progress, card, fillTable, copyText, download,
    STATUS_COLORS,
  };
})();
