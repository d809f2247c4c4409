// radixrt cache dashboard: polls /get_server_info (every second) and /cache_tree (every two) from the
// server that served this page, and draws them with plotly (served locally from the plotly package).
"use strict";

const INFO_MS = 1000;
const TREE_MS = 2000;
const WINDOW = 120;  // points kept per time series (two minutes at one a second)
const HOT_ROWS = 12;
const PLOT_CONFIG = {displayModeBar: false, responsive: true};

const state = {
  key: sessionStorage.getItem("radixrt-api-key"),
  series: {t: [], gen: [], prompt: [], running: [], waiting: [], free: [], evictable: [], locked: [], owned: [],
           hitWindow: [], hitAll: []},
  prev: null,
  lastInfo: null,
  lastTree: null,
  infoUpdates: 0,  // read by tests: they wait for these to move
  treeUpdates: 0,
};
window.radixrtDashboard = state;

function showKeyBox() {
  document.getElementById("keybox").style.display = "block";
}

document.getElementById("keybutton").addEventListener("click", () => {
  state.key = document.getElementById("key").value;
  sessionStorage.setItem("radixrt-api-key", state.key);
  document.getElementById("keybox").style.display = "none";
});

async function getJSON(path) {
  const headers = state.key ? {Authorization: "Bearer " + state.key} : {};
  const response = await fetch(path, {headers});
  if (response.status === 401 || response.status === 403) {  // the cache view is an admin route
    showKeyBox();
    const body = await response.json().catch(() => null);
    throw new Error((body && body.error && body.error.message) || "this page needs the admin key");
  }
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function setStatus(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = isError ? "error" : "";
}

function push(name, value) {
  const s = state.series[name];
  s.push(value);
  if (s.length > WINDOW) s.shift();
}

function layout(title, extra) {
  return Object.assign({title: {text: title, font: {size: 13}}, margin: {l: 44, r: 8, t: 28, b: 24},
                        showlegend: true, legend: {orientation: "h", y: -0.25, font: {size: 10}},
                        xaxis: {type: "date", tickformat: "%H:%M:%S", nticks: 4}, uirevision: title}, extra || {});
}

function line(name, y, extra) {
  // copies: Plotly.react redraws only data whose arrays are new objects (these series are mutated in place)
  return Object.assign({x: state.series.t.slice(), y: y.slice(), name: name, type: "scatter", mode: "lines"},
                       extra || {});
}

function onInfo(info) {
  const now = new Date();
  const s = state.series;
  let gen = null, prompt = null, hitWindow = null;
  if (state.prev) {
    const dt = (now - state.prev.time) / 1000;
    const p = state.prev.info;
    gen = Math.max(0, info.generated_tokens - p.generated_tokens) / dt;
    const newPrompt = info.prompt_tokens - p.prompt_tokens;
    const newCached = info.cached_tokens - p.cached_tokens;
    prompt = Math.max(0, newPrompt - newCached) / dt;
    hitWindow = newPrompt > 0 ? newCached / newPrompt : null;
  }
  state.prev = {time: now, info: info};
  push("t", now);
  push("gen", gen);
  push("prompt", prompt);
  push("running", info.num_running);
  push("waiting", info.num_waiting);
  const locked = info.kv_pages_cached - info.kv_pages_evictable;
  push("free", info.kv_pages_free);
  push("evictable", info.kv_pages_evictable);
  push("locked", locked);
  push("owned", info.kv_pages_total - info.kv_pages_free - info.kv_pages_cached);
  push("hitWindow", hitWindow);
  push("hitAll", info.cache_hit_rate);

  Plotly.react("plot-throughput", [line("generated tok/s", s.gen), line("prompt tok/s computed", s.prompt)],
               layout("throughput (tokens/s)"), PLOT_CONFIG);
  Plotly.react("plot-requests", [line("running", s.running), line("waiting", s.waiting)],
               layout("requests"), PLOT_CONFIG);
  const stacked = {stackgroup: "pool"};
  Plotly.react("plot-pool", [line("owned by running", s.owned, stacked), line("cached, in use", s.locked, stacked),
                             line("cached, evictable", s.evictable, stacked), line("free", s.free, stacked)],
               layout("KV pool (pages of " + info.page_size + " tokens)"), PLOT_CONFIG);
  Plotly.react("plot-hitrate", [line("last second", s.hitWindow, {connectgaps: false}), line("all time", s.hitAll)],
               layout("prefix cache hit rate", {yaxis: {range: [0, 1.02], tickformat: ".0%"}}), PLOT_CONFIG);

  document.getElementById("card-hitrate").textContent = (100 * info.cache_hit_rate).toFixed(1) + "%";
  document.getElementById("card-cached").textContent = info.cached_tokens.toLocaleString();
  document.getElementById("card-requests").textContent = info.num_running + " / " + info.num_waiting;
  document.getElementById("card-preemptions").textContent = info.num_preemptions.toLocaleString();
  document.getElementById("model").textContent = info.served_model_name || "";
  state.lastInfo = info;
  state.infoUpdates += 1;
}

function plain(text) {
  // plotly reads a little HTML in labels and hover text: prompt text must show as text, not as markup
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function flatten(view) {
  // the view's nested nodes -> plotly's ids/parents/values; folded children become one "… more" box
  const t = {ids: [], labels: [], parents: [], values: [], colors: [], custom: []};
  const rows = [];
  const stack = [[view.root, ""]];
  while (stack.length) {
    const [node, parent] = stack.pop();
    const id = String(node.id);
    const isRoot = parent === "";
    const label = isRoot ? "root" : plain(node.text.trim().slice(0, 24) || "·") + " (" + node.num_tokens + ")";
    t.ids.push(id); t.labels.push(label); t.parents.push(parent); t.values.push(node.num_tokens);
    t.colors.push(node.hits);
    const age = node.last_access_age_s === null ? "–" : node.last_access_age_s.toFixed(0) + " s ago";
    t.custom.push([node.num_tokens, node.hits, node.tokens_served, node.prefix_len, age, node.lock_ref, node.pins,
                   plain(node.text), plain((node.sessions || []).join(", ") || "–")]);
    if (!isRoot) rows.push(node);
    for (const child of node.children) stack.push([child, id]);
    if (node.omitted) {
      const o = node.omitted;
      t.ids.push("omitted-" + id); t.labels.push("… " + o.nodes + " more nodes"); t.parents.push(id);
      t.values.push(o.tokens); t.colors.push(o.hits);
      t.custom.push([o.tokens, o.hits, "–", "–", "–", "–", "–", "summarised: " + o.nodes + " nodes", "–"]);
    }
  }
  return [t, rows];
}

function onTree(view) {
  const [t, rows] = flatten(view);
  const trace = {
    type: "icicle", ids: t.ids, labels: t.labels, parents: t.parents, values: t.values,
    branchvalues: "remainder", customdata: t.custom, sort: false, tiling: {orientation: "v"},
    marker: {colors: t.colors, colorscale: "YlOrRd", reversescale: true, cmin: 0, showscale: true,
             colorbar: {title: {text: "hits"}, thickness: 12}},
    hovertemplate: "%{customdata[7]}<br>edge tokens %{customdata[0]} · prefix %{customdata[3]}<br>" +
                   "hits %{customdata[1]} · served %{customdata[2]}<br>last use %{customdata[4]} · " +
                   "locks %{customdata[5]} · pins %{customdata[6]} · sessions %{customdata[8]}<extra></extra>",
  };
  const title = view.disabled ? "the radix cache is disabled (--disable-radix-cache)"
    : view.num_nodes + " nodes, " + view.num_tokens.toLocaleString() + " tokens" +
      (view.num_nodes_shown < view.num_nodes ? " (largest " + view.num_nodes_shown + " shown)" : "");
  Plotly.react("tree", [trace], {margin: {l: 4, r: 4, t: 28, b: 4}, title: {text: title, font: {size: 13}},
                                 uirevision: "tree"}, PLOT_CONFIG);
  document.getElementById("tree").dataset.numNodes = String(view.num_nodes);
  document.getElementById("card-nodes").textContent = view.num_nodes.toLocaleString();

  rows.sort((a, b) => b.tokens_served - a.tokens_served || b.prefix_len - a.prefix_len);
  const body = document.querySelector("#hot-table tbody");
  body.replaceChildren();
  for (const node of rows.slice(0, HOT_ROWS)) {
    const tr = document.createElement("tr");
    const age = node.last_access_age_s === null ? "–" : node.last_access_age_s.toFixed(0) + " s ago";
    for (const [value, cls] of [[node.prefix_len, "num"], [node.num_tokens, "num"], [node.hits, "num"],
                                [node.tokens_served, "num"], [age, "num"], [node.text, "text"]]) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = typeof value === "number" ? value.toLocaleString() : value;  // text, never HTML
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  state.lastTree = view;
  state.treeUpdates += 1;
}

function poll(path, every, handle) {
  async function tick() {
    try {
      handle(await getJSON(path));
      setStatus("live · updated " + new Date().toLocaleTimeString(), false);
    } catch (e) {
      setStatus(String(e.message || e), true);
      console.error("dashboard: " + path + ": " + (e.stack || e));
    }
    setTimeout(tick, every);
  }
  tick();
}

poll("/get_server_info", INFO_MS, onInfo);
poll("/cache_tree?max_depth=12&max_nodes=400", TREE_MS, onTree);
