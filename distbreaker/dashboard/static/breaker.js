// One breaker's page: state, config, window, probes, bulkhead, budget and history,
// re-read on each of its transitions and every few seconds; its fleet rates and latency
// from its own event stream; operator actions when enabled.
"use strict";

const NAME = decodeURIComponent(location.pathname.slice("/breakers/".length));
const BUTTONS = [["forced_open", "Force open"], ["closed", "Close"], ["trip", "Trip"],
                 ["reset", "Reset"], ["disabled", "Disable"], ["metrics_only", "Metrics only"]];
let detail = null;
let loading = null;
let fleetRates = null;  // this name's fleet-wide calls/s, from its own event stream
let fleetLatency = null;

function facts(target, pairs) {
  document.getElementById(target).replaceChildren(...pairs.flatMap(([k, v]) =>
    [el("dt", {text: k}), el("dd", {}, v instanceof Node ? v : String(v))]));
}

function seconds(value) { return value + "s"; }

function renderShadows() {
  const shadows = detail.shadows || [];
  document.getElementById("shadows-section").hidden = shadows.length === 0;
  document.getElementById("shadows").replaceChildren(...shadows.map((s) =>
    el("tr", {"data-shadow": s.name},
       el("td", {text: s.name}),
       el("td", {}, stateBadge(s.state)),
       el("td", {class: "num", text: String(s.trips)}),
       el("td", {class: "num", text: String(s.rejected)}),
       el("td", {class: "num", text: String(s.avoided)}),
       el("td", {class: "num", text: String(s.seen)}),
       el("td", {text: s.summary || ""}))));
}

function render() {
  renderShadows();
  document.getElementById("name").textContent = NAME;
  document.title = "distbreaker — " + NAME;
  const b = detail.breaker;
  document.getElementById("state").replaceChildren(stateBadge(b ? b.state : null));
  document.getElementById("since").textContent = b ? "since " + clock(b.since_ms, true) : "";
  if (b) {
    const w = b.window;
    facts("state-facts", [
      ["state", stateBadge(b.state)],
      ["for", duration(b.in_state_s)],
      ["next call", retryText(b)],
      ["override", overrideText(b, detail.server_time_ms) || "-"],
      ["window", w.calls + " calls, " + w.failures + " failed, " + w.slow + " slow"],
      ["failure rate", percent(b.failure_rate)],
      ["slow-call rate", percent(b.slow_rate)],
      ["fleet calls/s", el("span", {id: "fleet-rates", text: ratesText(fleetRates)})],
      ["latency (window)", el("span", {id: "fleet-latency", text: latencyText(fleetLatency)})],
      ["calls recorded", b.calls_total === null || b.calls_total === undefined ? "-"
        : b.calls_total + " (" + b.failures_total + " failed) by every worker since the keys were created"],
      ["half-open", b.half_open.issued + " probes issued, " + b.half_open.done + " reported, " +
                    b.half_open.failed + " failed"],
      ["probes in flight", b.probes.length ? b.probes.map((p) => p.token + " (" +
        (p.expires_in_s > 0 ? "lease ends in " + duration(p.expires_in_s) : "expired") + ")").join(", ") : "none"],
      ["rejected by Redis", b.rejected + " (workers that know it is OPEN reject without asking)"],
      ["generation", b.generation],
      ["quorum", b.quorum ? (b.quorum.text || b.quorum.failing_workers + " of " +
        b.quorum.min_failing_workers + " workers failing") : "off"],
      ["config drift", b.config_drift ? "a worker runs " + b.config_drift.config.wire +
        " (the config in force governs it; distbreaker config adopt promotes one)" : "none"],
      ["config in force", b.config_in_force ? b.config_in_force.fingerprint +
        (b.config_in_force.why ? " (" + b.config_in_force.why + ")" : "") : "unset"],
      ["configs deployed", (b.configs || []).map((c) => c.fingerprint + (c.in_force ? " (in force)" : "") +
        ": " + c.workers + " workers").join(", ") || "none"],
    ]);
    const c = b.config;
    facts("config", [
      ["window", c.sliding_window_type + " of " + c.sliding_window_size],
      ["minimum calls", c.minimum_number_of_calls],
      ["failure threshold", c.failure_rate_threshold + "%"],
      ["slow-call threshold", c.slow_call_rate_threshold + "% over " + seconds(c.slow_call_duration_s)],
      ["open wait", seconds(c.wait_duration_in_open_state_s)],
      ["half-open probes", c.permitted_calls_in_half_open + " (lease " + seconds(c.half_open_lease_s) + ")"],
      ["max half-open", c.max_wait_in_half_open_s ? seconds(c.max_wait_in_half_open_s) : "no limit"],
      ["key TTL", seconds(c.key_ttl_s)],
      ["wire", c.wire],
    ]);
  } else {
    facts("state-facts", [["breaker", "none stored"]]);
    facts("config", [["breaker", "none stored"]]);
  }
  const bh = detail.bulkhead, rb = detail.budget;
  facts("others", [
    ["bulkhead", bh ? bh.in_use + "/" + (bh.limit || "?") + " in use, " + bh.waiting + " waiting" : "none"],
    ["bulkhead rejected", bh ? (bh.rejected || 0) : "-"],
    ["bulkhead limit", bh && bh.adaptive ? adaptiveText(bh.adaptive, detail.server_time_ms)
      : (bh ? "fixed" : "-")],
    ["retry budget", rb && rb.deposits !== null ? (rb.balance ?? "?") + " retries left (" +
      rb.deposits + " requests, " + rb.withdrawals + " retries in the window)" : "none"],
  ]);
  document.getElementById("history").replaceChildren(...[...(detail.history || [])].reverse().map((e) =>
    el("tr", {},
       el("td", {class: "num", text: clock(e.at_ms, true)}),
       el("td", {}, stateBadge(e.from), " → ", stateBadge(e.to)),
       el("td", {text: e.reason}),
       el("td", {text: e.actor || "-"}),
       el("td", {class: "num", text: percent(e.failure_rate)}),
       el("td", {class: "num", text: percent(e.slow_rate)}))));
}

async function load() {
  if (loading) return loading;
  loading = (async () => {
    const response = await fetch("/api/breakers/" + encodeURIComponent(NAME) + location.search);
    const body = await response.json();
    const error = document.getElementById("error");
    if (!response.ok) {
      error.textContent = body.error + (body.suggestions && body.suggestions.length
        ? " — did you mean " + body.suggestions.join(" or ") + "?" : "");
      error.classList.add("shown");
      return;
    }
    if (body.error) {  // foreign keys of this name, left unread; the rest is shown
      error.textContent = "foreign data, left unread: " + body.error;
      error.classList.add("shown");
    } else {
      error.classList.remove("shown");
    }
    detail = body;
    render();
  })().finally(() => { loading = null; });
  return loading;
}

async function act(action) {
  const result = document.getElementById("action-result");
  const response = await fetch("/api/breakers/" + encodeURIComponent(NAME) + "/actions/" + action, {
    method: "POST",
    headers: {"Content-Type": "application/json",
              "Authorization": "Bearer " + document.getElementById("token").value},
    body: JSON.stringify({reason: document.getElementById("reason").value,
                          actor: document.getElementById("actor").value}),
  });
  const body = await response.json();
  result.textContent = response.ok
    ? body.previous + " → " + body.state + " (" + body.action + " by " + body.actor + ": " + body.reason + ")"
    : "refused: " + body.error;
  sessionStorage.setItem("distbreaker-token", document.getElementById("token").value);
  await load();
}

async function setup() {
  const config = await (await fetch("/api/config")).json();
  if (config.actions) {
    document.getElementById("actions").hidden = false;
    document.getElementById("token").value = sessionStorage.getItem("distbreaker-token") || "";
    document.getElementById("buttons").replaceChildren(...BUTTONS.map(([id, label]) => {
      const button = el("button", {type: "button", "data-action": id, text: label});
      button.addEventListener("click", () => act(id));
      return button;
    }));
  }
  await load();
  // this name's stream only: its transitions and its row of each fleet read
  // the snapshot has its row as last read; an update comes only when the row changed
  const fleetRow = (data) => {
    const row = data.rows.find((r) => r.name === NAME && r.schema !== "v1");
    if (!row) return;
    fleetRates = row.rates;
    fleetLatency = row.latency;
    const shown = document.getElementById("fleet-rates");
    if (shown) shown.textContent = ratesText(fleetRates);
    const latency = document.getElementById("fleet-latency");
    if (latency) latency.textContent = latencyText(fleetLatency);
  };
  connectEvents({
    status: showStatus,
    transition: (event) => { if (event.name === NAME) load(); },
    snapshot: fleetRow,
    update: fleetRow,
  }, "name=" + encodeURIComponent(NAME) + "&type=status&type=transition&type=snapshot&type=update");
  setInterval(load, 3000);
}

setup();
