// The fleet page: one row per protected name, kept live from the event stream by diffs.
//
// The server sends the whole fleet once (snapshot) and then only the rows that changed
// (update); this page redraws only those rows, and in them only the cells whose text
// changed, and moves a row only when its place in the order changed. Every other row's
// node stays the same node, so a selection, the scroll position and the browser's find
// keep working at 10,000 names. Times ("for", "next call") are counted here from the
// rows' absolute times, once a second, for the rows on screen only.
"use strict";

const page = {rows: new Map(), nodes: new Map(), order: [], sortValues: new Map(),
              spark: new Map(), serverMs: 0, receivedAt: 0, seq: -1, transitions: [],
              prefix: "", selected: null, pools: new Map(),
              query: "", filter: "", sort: "severity", dir: 1,
              // what this page did: updates applied, rows they carried, ms spent (the bench reads it)
              stats: {updates: 0, rows: 0, ms: 0, ticks: 0, tickMs: 0}};

function nowMs() { return page.serverMs + (Date.now() - page.receivedAt); }

// A name with keys of both key schemas has two rows: v1 ones are keyed apart.
function rowKey(row) { return row.schema === "v1" ? "v1:" + row.name : row.name; }

// -- order ------------------------------------------------------------------------------
function num(value, missing) { return value === null || value === undefined ? missing : value; }

function sortValue(row) {
  const b = row.breaker;
  const state = row.error ? "ERROR" : (row.state || "NONE");
  const tail = [row.name, row.schema === "v1" ? 1 : 0];
  switch (page.sort) {
    case "name": return tail;
    case "failure": return [-num(b && b.failure_rate, -1), ...tail];
    case "calls": return [-num(row.rates && row.rates.calls, -1), ...tail];
    case "rejected": return [-num(row.rates && row.rates.rejected, -1), ...tail];
    case "latency": return [-num(row.latency && row.latency.p99_ms, -1), ...tail];
    case "workers": return [-num(b && b.workers, -1), ...tail];
    default: return [SEVERITY[state] ?? 7, -num(b && b.failure_rate, -1), ...tail];
  }
}

function compareValues(x, y) {
  for (let i = 0; i < x.length; i++) {
    if (x[i] < y[i]) return -page.dir;
    if (x[i] > y[i]) return page.dir;
  }
  return 0;
}

// Where a sort value belongs in page.order (binary search: the order is total).
function position(value) {
  let lo = 0, hi = page.order.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (compareValues(page.sortValues.get(page.order[mid]), value) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// -- filter -----------------------------------------------------------------------------
function globRegex(text) {
  const escaped = text.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp("^" + escaped + "$", "i");
}

let matcher = () => true;

function setQuery(text) {
  page.query = text.trim();
  if (!page.query) matcher = () => true;
  else if (/[*?]/.test(page.query)) {
    const re = globRegex(page.query);
    matcher = (name) => re.test(name);
  } else {
    const lower = page.query.toLowerCase();
    matcher = (name) => name.toLowerCase().includes(lower);
  }
}

function wanted(row) {
  if (!matcher(row.name)) return false;
  const state = row.error ? "ERROR" : row.state;
  switch (page.filter) {
    case "": return true;
    case "problems": return !!state && state !== "CLOSED";
    case "override": return state === "DISABLED" || state === "METRICS_ONLY";
    case "bulkhead": case "budget": case "rate_limiter": return !!row[page.filter];
    default: return state === page.filter;
  }
}

// -- cells ------------------------------------------------------------------------------
function probes(b) {
  if (!b || b.state !== "HALF_OPEN") return "-";
  const inFlight = Math.max(0, b.half_open.issued - b.half_open.done);
  return inFlight + " in flight, " + b.half_open.done + "/" + b.config.permitted_calls_in_half_open + " done";
}

function bulkheadCell(cell, bh, now) {
  if (!bh) { cell.classList.add("dim"); cell.textContent = "-"; return; }
  cell.classList.remove("dim");
  const limit = bh.limit || 0;
  const share = limit ? Math.min(1, bh.in_use / limit) : 0;
  const bar = el("span", {class: "bar" + (limit && bh.in_use >= limit ? " full" : "")},
                 el("span", {style: "width:" + Math.round(share * 100) + "%"}));
  const a = bh.adaptive;
  if (!a) { cell.replaceChildren(bar, bh.in_use + "/" + (limit || "?")); return; }
  // An adaptive limit: why it last moved, and how long ago (the title has the details).
  const ago = a.moved_at_ms ? " " + duration(Math.max(0, now - a.moved_at_ms) / 1000) + " ago" : "";
  cell.title = adaptiveText(a, now);
  cell.replaceChildren(bar, bh.in_use + "/" + (limit || "?") + " ",
                       el("span", {class: "dim", text: "adaptive: " + (a.why || "?") + ago}));
}

function budgetText(rb) {
  if (!rb || rb.deposits == null) return "-";
  const left = rb.balance === null || rb.balance === undefined ? "?" : rb.balance;
  return left + " left (+" + rb.deposits + " −" + rb.withdrawals + ")";
}

function limiterText(rl, rates) {
  if (!rl) return "-";
  const per = rl.limit_refresh_period_ms ? duration(rl.limit_refresh_period_ms / 1000) : "?";
  const parts = [(rl.available == null ? "?" : rl.available) + "/" + (rl.burst ?? "?") +
                 " free", (rl.limit_for_period ?? "?") + " per " + per + (rl.overridden ? " (operator)" : "")];
  if (rates) parts.push(perSecond(rates.permits) + " permits/s, " + perSecond(rates.rejected) + " rejected/s");
  else parts.push(rl.calls + " granted, " + rl.rejected + " rejected");
  return parts.join(" · ");
}

function workersText(b) {
  if (!b || b.workers === null || b.workers === undefined) return "-";
  return String(b.workers);
}

function stateText(row, now) {
  const b = row.breaker;
  if (!b) return "";
  const due = b.state === "OPEN" && b.open_until_ms && b.open_until_ms <= now;
  return [due ? "probe due" : "", b.quorum && b.quorum.pending ? b.quorum.text : "",
          overrideText(b, now)].filter(Boolean).join(" ");
}

// A duration to the second below a minute, then to the minute (the page redraws nothing
// while a long-standing state stands).
function coarse(seconds) {
  if (seconds < 60) return duration(seconds);
  const s = Math.floor(seconds);
  if (s < 3600) return Math.floor(s / 60) + "m";
  return duration(seconds);
}

function nextText(b, now) {
  if (!b) return "-";
  const retry = Object.assign({}, b, {retry_in_s: b.state === "OPEN" && b.open_until_ms
    ? Math.max(0, b.open_until_ms - now) / 1000 : b.retry_in_s});
  return retryText(retry);
}

// Each column: what its cell shows (a string that changes when the cell must be redrawn)
// and how to draw it. `timed`: it moves with time alone (redrawn each second on screen).
const COLUMNS = [
  {cls: "name", key: (r) => r.name + "|" + r.schema, draw: (c, r) => {
    const v1 = r.schema === "v1";
    c.title = r.name;
    c.replaceChildren(el("a", {href: breakerLink(r.name) + (v1 ? "?schema=v1" : ""), text: r.name}),
      v1 ? el("span", {class: "dim", text: " v1", title: "key schema v1: workers not yet upgraded (read-only)"}) : "");
  }},
  {cls: "st", timed: true, key: (r, now) => (r.error ? "ERROR" : r.state) + "|" + stateText(r, now),
   draw: (c, r, now) => {
     const extra = stateText(r, now);
     c.replaceChildren(stateBadge(r.error ? "ERROR" : r.state), extra ? el("span", {class: "dim", text: " " + extra}) : "");
   }},
  {cls: "for num", timed: true, text: (r, now) => r.breaker ? coarse(Math.max(0, now - r.breaker.since_ms) / 1000) : "-"},
  {cls: "fail num", key: (r) => {
    const points = page.spark.get(r.name);
    return percent(r.breaker && r.breaker.failure_rate) + "|" + (points ? points.length + ":" + points[points.length - 1][0] : "");
  }, draw: (c, r) => {
    const points = r.schema === "v1" ? null : page.spark.get(r.name);
    c.replaceChildren(percent(r.breaker && r.breaker.failure_rate), points && points.length > 1 ? sparkline(points) : "");
  }},
  {cls: "slow num", text: (r) => percent(r.breaker && r.breaker.slow_rate)},
  {cls: "calls num", text: (r) => r.breaker ? String(r.breaker.calls) : "-"},
  {cls: "rates num", title: "fleet-wide, between two reads", text: (r) => ratesText(r.rates)},
  {cls: "latency num", title: "fleet-wide, over the window", text: (r) => latencyText(r.latency)},
  {cls: "workers num", title: "worker processes that reported in the last minute", text: (r) => workersText(r.breaker)},
  {cls: "probes", text: (r) => probes(r.breaker)},
  {cls: "next", timed: true, text: (r, now) => nextText(r.breaker, now)},
  {cls: "bulkhead num", timed: true, key: (r, now) => JSON.stringify(r.bulkhead) + (r.bulkhead && r.bulkhead.adaptive ? Math.floor(now / 1000) : ""),
   draw: (c, r, now) => bulkheadCell(c, r.bulkhead, now)},
  {cls: "budget num", title: "retries left; requests and retries in the window", text: (r) => budgetText(r.budget)},
  {cls: "ratelimiter num", title: "permits free now of the burst; the limit; granted and rejected per second",
   text: (r) => limiterText(r.rate_limiter, r.rl_rates)},
];

function cellKey(column, row, now) {
  return column.text ? column.text(row, now) : column.key(row, now);
}

function drawCell(cell, column, row, now) {
  const key = cellKey(column, row, now);
  if (cell._key === key) return;
  cell._key = key;
  if (column.text) cell.textContent = key;
  else column.draw(cell, row, now);
}

function newRow(key, row) {
  const node = el("div", {class: "row", role: "row", "data-key": key, "data-name": row.name});
  if (row.schema === "v1") node.dataset.schema = "v1";
  for (const column of COLUMNS) {
    node.append(el("span", {class: "c " + column.cls, role: "cell", title: column.title}));
  }
  if (key === page.selected) select(node, key);
  return node;
}

function drawRow(node, row, now) {
  node.classList.toggle("error", !!row.error);
  if (row.error) {
    // an error row: the badge, then the error across the other cells
    const cells = node.children;
    drawCell(cells[0], COLUMNS[0], row, now);
    drawCell(cells[1], COLUMNS[1], row, now);
    if (cells[2]._key !== "error:" + row.error) {
      cells[2]._key = "error:" + row.error;
      cells[2].textContent = row.error;
      cells[2].classList.add("span");
      for (let i = 3; i < cells.length; i++) { cells[i]._key = ""; cells[i].textContent = ""; }
    }
    return;
  }
  node.children[2].classList.remove("span");
  COLUMNS.forEach((column, i) => drawCell(node.children[i], column, row, now));
}

// -- applying what the server sends -----------------------------------------------------
function place(key) {
  const value = sortValue(page.rows.get(key));
  const index = position(value);
  page.order.splice(index, 0, key);
  page.sortValues.set(key, value);
  const next = index + 1 < page.order.length ? page.nodes.get(page.order[index + 1]) : null;
  const body = document.getElementById("rows");
  const node = page.nodes.get(key);
  if (node.nextSibling !== next || node.parentNode !== body) body.insertBefore(node, next);
}

function unplace(key) {
  const old = page.sortValues.get(key);
  if (old === undefined) return;
  let index = position(old);
  if (page.order[index] !== key) index = page.order.indexOf(key);  // the sort changed meanwhile
  if (index >= 0) page.order.splice(index, 1);
  page.sortValues.delete(key);
}

function upsert(row, now) {
  const key = rowKey(row);
  page.rows.set(key, row);
  let node = page.nodes.get(key);
  if (!node) {
    node = newRow(key, row);
    page.nodes.set(key, node);
  }
  drawRow(node, row, now);
  node.hidden = !wanted(row);
  const value = sortValue(row);
  const old = page.sortValues.get(key);
  if (old === undefined || compareValues(old, value) !== 0) {
    unplace(key);
    place(key);
  }
}

function remove(key) {
  const node = page.nodes.get(key);
  unplace(key);
  page.rows.delete(key);
  page.nodes.delete(key);
  if (node) node.remove();
}

function take(data) {
  page.serverMs = data.server_time_ms;
  page.receivedAt = Date.now();
  page.prefix = data.prefix;
  page.seq = data.seq;
  showClock(nowMs());
}

// The server's clock, to the minute: one that moved every second would redraw the page
// every second.
function showClock(now) {
  const shown = new Date(now).toLocaleTimeString(undefined, {hour: "2-digit", minute: "2-digit",
    hour12: false, timeZoneName: "short"});
  const at = document.getElementById("server-time");
  if (at.textContent !== shown) at.textContent = shown;
}

function snapshot(data) {
  page.spark = new Map(Object.entries(data.spark || {}));
  take(data);
  for (const name of [...page.pools.keys()]) removePool(name);
  for (const pool of data.pools || []) drawPool(pool);
  const now = nowMs();
  const body = document.getElementById("rows");
  const keep = new Set(data.rows.map(rowKey));
  for (const key of [...page.rows.keys()]) if (!keep.has(key)) remove(key);
  const empty = body.querySelector(".empty");
  if (empty) empty.remove();
  if (!page.order.length) {
    // the first snapshot: every row built, sorted, appended at once
    for (const row of data.rows) {
      const key = rowKey(row);
      page.rows.set(key, row);
      const node = newRow(key, row);
      page.nodes.set(key, node);
      drawRow(node, row, now);
      node.hidden = !wanted(row);
      page.sortValues.set(key, sortValue(row));
    }
    page.order = [...page.rows.keys()].sort((a, b) => compareValues(page.sortValues.get(a), page.sortValues.get(b)));
    const fragment = document.createDocumentFragment();
    for (const key of page.order) fragment.append(page.nodes.get(key));
    body.append(fragment);
  } else {
    for (const row of data.rows) upsert(row, now);  // a new snapshot after falling behind
  }
  summary();
}

function update(data) {
  if (data.seq <= page.seq) return;  // already in the snapshot
  const started = performance.now();
  take(data);
  const now = nowMs();
  for (const name of data.pools_removed || []) removePool(name);
  for (const pool of data.pools || []) drawPool(pool);
  for (const key of data.removed || []) remove(key);
  for (const row of data.rows) {
    if (row.breaker && row.schema !== "v1") addSparkPoint(row, data.server_time_ms);
    upsert(row, now);
  }
  summary();
  page.stats.updates++;
  page.stats.rows += data.rows.length;
  page.stats.ms += performance.now() - started;
}

function addSparkPoint(row, serverMs) {
  const points = page.spark.get(row.name) || [];
  const last = points[points.length - 1];
  if (!last || serverMs - last[0] >= 4000) {
    points.push([serverMs, row.breaker.failure_rate, row.breaker.slow_rate, row.rates ? row.rates.calls : null]);
    if (points.length > 150) points.shift();
  }
  page.spark.set(row.name, points);
}

function summary() {
  document.getElementById("prefix").textContent = page.prefix;
  const counts = {};
  let shown = 0;
  for (const [key, row] of page.rows) {
    const state = row.error ? "ERROR" : (row.state || "no breaker");
    counts[state] = (counts[state] || 0) + 1;
    if (!page.nodes.get(key).hidden) shown++;
  }
  document.getElementById("counts").textContent = page.rows.size + " names: " +
    Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([s, n]) => n + " " + s).join(", ");
  document.getElementById("shown").textContent = page.rows.size
    ? (shown === page.rows.size ? "" : shown + " of " + page.rows.size + " shown")
    : "no breakers, bulkheads, budgets or rate limiters under this prefix";
}

// Search, filter or sort changed: every row's visibility, and the order when it moved.
function refilter() {
  let changed = false;
  for (const [key, row] of page.rows) {
    const hide = !wanted(row);
    const node = page.nodes.get(key);
    if (node.hidden !== hide) { node.hidden = hide; changed = true; }
  }
  summary();
  return changed;
}

function resort() {
  for (const [key, row] of page.rows) page.sortValues.set(key, sortValue(row));
  page.order.sort((a, b) => compareValues(page.sortValues.get(a), page.sortValues.get(b)));
  const body = document.getElementById("rows");
  let cursor = body.firstChild;
  for (const key of page.order) {  // move only the rows out of place
    const node = page.nodes.get(key);
    if (node === cursor) cursor = cursor.nextSibling;
    else body.insertBefore(node, cursor);
  }
  for (const header of document.querySelectorAll("#fleet .head [data-sort]")) {
    header.setAttribute("aria-sort", header.dataset.sort === page.sort
      ? (page.dir > 0 ? "ascending" : "descending") : "none");
  }
}

// -- pools: a table of members per pool, redrawn when that pool changed ------------------
function ejectedFor(member, now) {
  if (member.state !== "ejected") return "-";
  if (!member.ejected_until) return "until unejected";
  return coarse(Math.max(0, member.ejected_until * 1000 - now) / 1000) + " more";
}

function memberState(member) {
  const state = member.state === "ejected" ? "OPEN" : member.state === "probing" ? "HALF_OPEN" : "CLOSED";
  return el("span", {class: "state s-" + state, "data-state": member.state, text: member.state});
}

function ms(seconds) { return seconds === null || seconds === undefined ? "-" : Math.round(seconds * 1000) + "ms"; }

function drawPool(pool) {
  const now = nowMs();
  const old = page.pools.get(pool.pool);
  const open = old ? old.node.open : true;
  const summary = pool.error ? pool.error : pool.members + " members, " + pool.ejected + " ejected, " +
    pool.healthy + " healthy" + (pool.panic ? " — PANIC: every member is picked" : "");
  const node = el("details", {class: "pool", "data-pool": pool.pool},
    el("summary", {}, el("strong", {text: pool.pool}), " ", el("span", {class: "dim", text: summary})));
  node.open = open;
  if (!pool.error) {
    node.append(el("table", {class: "members"},
      el("thead", {}, el("tr", {}, ...["Member", "State", "Why", "For", "In flight", "Success rate",
        "Latency (mean · avg)", "Ejections", "Calls (failed)"].map((h) => el("th", {text: h})))),
      el("tbody", {}, ...pool.rows.map((m) => el("tr", {"data-member": m.member},
        el("td", {class: "name", text: m.member + (m.weight && m.weight !== 1 ? " ×" + m.weight : "")}),
        el("td", {}, memberState(m), m.override ? el("span", {class: "dim", text: " " + m.override.replace("_", " ")}) : "",
           m.capped ? el("span", {class: "dim", text: " capped (max ejection %)"}) : ""),
        el("td", {class: "why", text: m.why || "-"}),
        el("td", {class: "num until", "data-until": m.ejected_until || "", text: ejectedFor(m, now)}),
        el("td", {class: "num", text: String(m.in_flight)}),
        el("td", {class: "num", text: m.success_rate === null || m.success_rate === undefined ? "-" : m.success_rate.toFixed(1) + "%"}),
        el("td", {class: "num", text: ms(m.mean_latency) + " · " + ms(m.latency_ewma)}),
        el("td", {class: "num", text: String(m.ejections)}),
        el("td", {class: "num", text: m.calls + " (" + m.failures + ")"}))))));
  }
  const box = document.getElementById("pools");
  if (old) old.node.replaceWith(node);
  else {
    const after = [...page.pools.keys()].sort().find((n) => n > pool.pool);
    box.insertBefore(node, after ? page.pools.get(after).node : null);
  }
  page.pools.set(pool.pool, {row: pool, node: node});
  document.getElementById("pools-section").hidden = false;
}

function removePool(name) {
  const old = page.pools.get(name);
  if (old) old.node.remove();
  page.pools.delete(name);
  document.getElementById("pools-section").hidden = page.pools.size === 0;
}

function tickPools(now) {
  for (const {row, node} of page.pools.values()) {
    if (!row.ejected || !node.open) continue;
    for (const cell of node.querySelectorAll("td.until")) {
      const tr = cell.closest("tr");
      const member = row.rows.find((m) => m.member === tr.dataset.member);
      if (!member) continue;
      const text = ejectedFor(member, now);
      if (cell.textContent !== text) cell.textContent = text;
    }
  }
}

// -- selection --------------------------------------------------------------------------
function select(node, key) {
  const before = page.selected && page.nodes.get(page.selected);
  if (before && before !== node) { before.classList.remove("selected"); before.removeAttribute("aria-selected"); }
  page.selected = key;
  node.classList.add("selected");
  node.setAttribute("aria-selected", "true");
}

document.getElementById("rows").addEventListener("click", (event) => {
  if (event.target.closest("a")) return;
  if (window.getSelection && String(window.getSelection())) return;  // selecting text
  const node = event.target.closest(".row[data-key]");
  if (node) select(node, node.dataset.key);
});

// -- time cells, on screen only ---------------------------------------------------------
// The rows on screen, from the scroll position: every shown row is ROW_PX high (CSS), so
// no hit test and no observer on 10,000 rows (either would cost every frame).
const ROW_PX = 33;

function visibleRows() {
  const box = document.getElementById("rows").getBoundingClientRect();
  if (box.bottom <= 0 || box.top >= innerHeight) return [];
  const first = Math.max(0, Math.floor(-box.top / ROW_PX));
  const count = Math.ceil(innerHeight / ROW_PX) + 1;
  const out = [];
  let index = 0;
  for (const key of page.order) {
    const node = page.nodes.get(key);
    if (node.hidden) continue;
    if (index >= first) out.push(node);
    if (++index >= first + count) break;
  }
  return out;
}

const TIMED = COLUMNS.map((column, i) => [column, i]).filter(([column]) => column.timed);

function drawTimed(node, row, now) {
  if (row.error) return;
  for (const [column, i] of TIMED) drawCell(node.children[i], column, row, now);
}

function tick() {
  if (!page.receivedAt) return;
  const started = performance.now();
  const now = nowMs();
  showClock(now);
  tickPools(now);
  for (const node of visibleRows()) {
    const row = page.rows.get(node.dataset.key);
    if (row) drawTimed(node, row, now);
  }
  page.stats.ticks++;
  page.stats.tickMs += performance.now() - started;
}

// -- controls ---------------------------------------------------------------------------
function controls() {
  const search = document.getElementById("search");
  const filter = document.getElementById("filter");
  const sort = document.getElementById("sort");
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { setQuery(search.value); refilter(); }, 120);
  });
  filter.addEventListener("change", () => { page.filter = filter.value; refilter(); });
  sort.addEventListener("change", () => { page.sort = sort.value; page.dir = 1; resort(); });
  for (const header of document.querySelectorAll("#fleet .head [data-sort]")) {
    header.addEventListener("click", () => {
      page.dir = page.sort === header.dataset.sort ? -page.dir : 1;
      page.sort = header.dataset.sort;
      sort.value = page.sort;
      resort();
    });
  }
}

function renderTransitions() {
  const body = document.getElementById("transitions");
  body.replaceChildren(...page.transitions.map((e) => el("tr", {},
    el("td", {class: "num dim", text: clock(e.at_ms, false)}),
    el("td", {class: "name"}, el("a", {href: breakerLink(e.name), text: e.name})),
    el("td", {}, stateBadge(e.from), " → ", stateBadge(e.to)),
    el("td", {text: e.reason + (e.actor ? " — by " + e.actor : "")}))));
}

function flash(key) {
  const node = page.nodes.get(key);
  if (!node) return;
  node.classList.remove("flash");
  void node.offsetWidth;  // restart the animation
  node.classList.add("flash");
}

controls();
connectEvents({
  status: showStatus,
  snapshot: snapshot,
  update: update,
  transition: (event) => {
    // Shown at once; the read of that name that follows fills in the rest.
    const row = page.rows.get(event.name);
    if (row && row.breaker) {
      const b = Object.assign({}, row.breaker, {state: event.to, since_ms: event.at_ms,
        open_until_ms: event.to === "OPEN" ? event.at_ms + row.breaker.config.wait_duration_in_open_state_s * 1000 : null});
      upsert(Object.assign({}, row, {state: event.to, breaker: b}), nowMs());
      summary();
    }
    flash(event.name);
    page.transitions.unshift(event);
    page.transitions.length = Math.min(page.transitions.length, 20);
    renderTransitions();
  },
});
setInterval(tick, 1000);
