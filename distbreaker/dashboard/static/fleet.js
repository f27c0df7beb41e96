// The fleet page: one row per protected name, updated live from the event stream.
"use strict";

const page = {rows: new Map(), spark: new Map(), serverMs: 0, receivedAt: 0,
              flash: new Set(), transitions: [], prefix: ""};

function nowMs() { return page.serverMs + (Date.now() - page.receivedAt); }

function severity(row) {
  const state = row.error ? "ERROR" : (row.state || "NONE");
  const rate = row.breaker && row.breaker.failure_rate >= 0 ? row.breaker.failure_rate : -1;
  return [SEVERITY[state] ?? 7, -rate, row.name];
}

function compare(a, b) {
  const x = severity(a), y = severity(b);
  for (let i = 0; i < x.length; i++) {
    if (x[i] < y[i]) return -1;
    if (x[i] > y[i]) return 1;
  }
  return 0;
}

function take(snapshot) {
  page.serverMs = snapshot.server_time_ms;
  page.receivedAt = Date.now();
  page.prefix = snapshot.prefix;
  page.rows = new Map(snapshot.rows.map((row) => [rowKey(row), row]));
}

// A name with keys of both key schemas has two rows: v1 ones are keyed apart.
function rowKey(row) { return row.schema === "v1" ? "v1:" + row.name : row.name; }

function probes(b) {
  if (!b || b.state !== "HALF_OPEN") return "-";
  const permitted = b.config.permitted_calls_in_half_open;
  const inFlight = Math.max(0, b.half_open.issued - b.half_open.done);
  return inFlight + " in flight, " + b.half_open.done + "/" + permitted + " done";
}

function bulkheadCell(bh) {
  if (!bh) return el("td", {class: "dim", text: "-"});
  const limit = bh.limit || 0;
  const share = limit ? Math.min(1, bh.in_use / limit) : 0;
  const bar = el("span", {class: "bar" + (limit && bh.in_use >= limit ? " full" : "")},
                 el("span", {style: "width:" + Math.round(share * 100) + "%"}));
  const a = bh.adaptive;
  if (!a) return el("td", {class: "num"}, bar, bh.in_use + "/" + (limit || "?"));
  // An adaptive limit: why it last moved, and how long ago (the title has the details).
  const ago = a.moved_at_ms ? " " + duration(Math.max(0, nowMs() - a.moved_at_ms) / 1000) + " ago" : "";
  return el("td", {class: "num", title: adaptiveText(a, nowMs())}, bar,
            bh.in_use + "/" + (limit || "?") + " ",
            el("span", {class: "dim", text: "adaptive: " + (a.why || "?") + ago}));
}

function budgetCell(rb) {
  if (!rb || rb.deposits === null) return el("td", {class: "dim", text: "-"});
  const left = rb.balance === null || rb.balance === undefined ? "?" : rb.balance;
  return el("td", {class: "num", title: "retries left; requests and retries in the window"},
            left + " left ", el("span", {class: "dim", text: "(+" + rb.deposits + " −" + rb.withdrawals + ")"}));
}

function rowElement(row) {
  const v1 = row.schema === "v1";
  const tr = el("tr", {"data-name": row.name});
  if (v1) tr.dataset.schema = "v1";
  const nameCell = el("td", {class: "name", title: row.name},
                      el("a", {href: breakerLink(row.name) + (v1 ? "?schema=v1" : ""), text: row.name}),
                      v1 ? el("span", {class: "dim", text: " v1",
                                        title: "key schema v1: workers not yet upgraded (read-only)"}) : null);
  if (row.error) {
    tr.className = "error";
    tr.append(nameCell, el("td", {}, stateBadge("ERROR")),
              el("td", {colspan: "10", text: row.error}));
    return tr;
  }
  const b = row.breaker;
  const now = nowMs();
  const inState = b ? Math.max(0, now - b.since_ms) / 1000 : null;
  const due = b && b.state === "OPEN" && b.open_until_ms && b.open_until_ms <= now;
  const retry = b ? Object.assign({}, b, {retry_in_s: b.state === "OPEN" && b.open_until_ms
                     ? Math.max(0, b.open_until_ms - now) / 1000 : b.retry_in_s}) : null;
  const failure = el("td", {class: "num"}, percent(b && b.failure_rate),
                     v1 ? null : sparkline(page.spark.get(row.name)));
  tr.append(nameCell,
            el("td", {}, stateBadge(row.state),
               due ? el("span", {class: "dim", text: " probe due"}) : null,
               b && b.quorum && b.quorum.pending ? el("span", {class: "dim", text: " " + b.quorum.text}) : null,
               overrideText(b, now) ? el("span", {class: "dim", text: " " + overrideText(b, now)}) : null),
            el("td", {class: "num", text: b ? duration(inState) : "-"}),
            failure,
            el("td", {class: "num", text: percent(b && b.slow_rate)}),
            el("td", {class: "num", text: b ? String(b.calls) : "-"}),
            el("td", {class: "num rates", title: "fleet-wide, over the last read interval",
                      text: ratesText(row.rates)}),
            el("td", {class: "num latency", title: "fleet-wide, over the window",
                      text: latencyText(row.latency)}),
            el("td", {text: probes(b)}),
            el("td", {text: retryText(retry)}),
            bulkheadCell(row.bulkhead),
            budgetCell(row.budget));
  if (page.flash.has(row.name)) tr.classList.add("flash");
  return tr;
}

function render() {
  document.getElementById("prefix").textContent = page.prefix;
  document.getElementById("server-time").textContent = clock(nowMs(), false);
  const rows = [...page.rows.values()].sort(compare);
  const counts = {};
  for (const row of rows) {
    const key = row.error ? "ERROR" : (row.state || "no breaker");
    counts[key] = (counts[key] || 0) + 1;
  }
  document.getElementById("counts").textContent = rows.length + " names: " +
    Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([s, n]) => n + " " + s).join(", ");
  const body = document.getElementById("rows");
  body.replaceChildren(...(rows.length ? rows.map(rowElement)
    : [el("tr", {}, el("td", {colspan: "12", class: "dim", text: "no breakers, bulkheads or budgets under this prefix"}))]));
  page.flash.clear();
}

function renderTransitions() {
  const body = document.getElementById("transitions");
  body.replaceChildren(...page.transitions.map((e) => el("tr", {},
    el("td", {class: "num dim", text: clock(e.at_ms, false)}),
    el("td", {class: "name"}, el("a", {href: breakerLink(e.name), text: e.name})),
    el("td", {}, stateBadge(e.from), " → ", stateBadge(e.to)),
    el("td", {text: e.reason + (e.actor ? " — by " + e.actor : "")}))));
}

connectEvents({
  status: showStatus,
  snapshot: (data) => {
    page.spark = new Map(Object.entries(data.spark || {}));
    take(data);
    render();
  },
  update: (data) => {
    take(data);
    for (const row of data.rows) {
      if (!row.breaker || row.schema === "v1") continue;
      const points = page.spark.get(row.name) || [];
      const last = points[points.length - 1];
      if (!last || data.server_time_ms - last[0] >= 4000) {
        points.push([data.server_time_ms, row.breaker.failure_rate, row.breaker.slow_rate,
                     row.rates ? row.rates.calls : null]);
        if (points.length > 150) points.shift();
      }
      page.spark.set(row.name, points);
    }
    render();
  },
  transition: (event) => {
    // Shown at once; the fresh read that follows fills in the rates.
    const row = page.rows.get(event.name);
    if (row && row.breaker) {
      row.state = event.to;
      row.breaker.state = event.to;
      row.breaker.since_ms = event.at_ms;
      row.breaker.open_until_ms = event.to === "OPEN"
        ? event.at_ms + row.breaker.config.wait_duration_in_open_state_s * 1000 : null;
    }
    page.flash.add(event.name);
    page.transitions.unshift(event);
    page.transitions.length = Math.min(page.transitions.length, 20);
    render();
    renderTransitions();
  },
});
setInterval(() => { if (page.receivedAt) render(); }, 1000);
