// Shared helpers of the dashboard pages: formatting, DOM building (text only, never
// innerHTML with data), the server-sent event stream, the Redis status banner.
"use strict";

const SEVERITY = {FORCED_OPEN: 0, OPEN: 1, HALF_OPEN: 2, ERROR: 3, METRICS_ONLY: 4,
                  CLOSED: 5, DISABLED: 6};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 1) return Math.round(seconds * 1000) + "ms";
  const s = Math.floor(seconds);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
}

function clock(ms, withDate) {
  if (!ms) return "-";
  const options = {hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
                   timeZoneName: "short"};
  if (withDate) Object.assign(options, {year: "numeric", month: "2-digit", day: "2-digit"});
  return new Date(ms).toLocaleString(undefined, options);
}

// Fleet-wide calls per second (rates: the dashboard's difference of two reads of the
// state record's counters), with the failures and rejections per second.
function perSecond(value) {
  return value >= 10 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toFixed(2);
}

function ratesText(rates) {
  if (!rates) return "-";
  return perSecond(rates.calls) + "/s (" + perSecond(rates.success) + " ok, " +
    perSecond(rates.failure) + " failed, " + perSecond(rates.slow) + " slow, " +
    perSecond(rates.rejected) + " rejected)";
}

// Fleet-wide call latency over the window: p50 / p99 of a count window (every call's
// duration); of a time window "~": of its per-second mean latencies (it keeps sums).
function latencyText(latency) {
  if (!latency) return "-";
  if (latency.p50_ms === undefined) return "mean " + Math.round(latency.mean_ms) + "ms";
  const about = latency.per === "second" ? "~" : "";
  return about + "p50 " + latency.p50_ms + "ms · " + about + "p99 " + latency.p99_ms + "ms";
}

function percent(value) {
  return value === null || value === undefined || value < 0 ? "-" : value + "%";
}

function stateBadge(state) {
  const name = state || "NONE";
  return el("span", {class: "state s-" + name, "data-state": name, text: state || "none"});
}

// A tiny SVG sparkline of [t, failure_rate, slow_rate] points (rates -1: too few calls).
function sparkline(points) {
  const width = 90, height = 20;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  if (!points || points.length < 2) return svg;
  const t0 = points[0][0], t1 = points[points.length - 1][0] || t0 + 1;
  for (const [index, colour] of [[2, "#d29922"], [1, "#e5534b"]]) {
    let path = "", gap = true;
    for (const p of points) {
      if (p[index] === null || p[index] < 0) { gap = true; continue; }  // too few calls
      const x = (p[0] - t0) / Math.max(1, t1 - t0) * (width - 2) + 1;
      const y = height - 1 - p[index] / 100 * (height - 2);
      path += (gap ? "M" : "L") + x.toFixed(1) + " " + y.toFixed(1) + " ";
      gap = false;
    }
    if (!path) continue;
    const line = document.createElementNS(ns, "path");
    line.setAttribute("d", path);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour);
    line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  return svg;
}

// The live stream: handlers by event kind; reconnects by itself (EventSource does).
function connectEvents(handlers, query) {
  const live = document.getElementById("live");
  const source = new EventSource("/api/events" + (query ? "?" + query : ""));
  source.onopen = () => { live.textContent = "live"; live.className = "ok"; };
  source.onerror = () => { live.textContent = "reconnecting to the dashboard…"; live.className = "bad"; };
  for (const [kind, handler] of Object.entries(handlers)) {
    source.addEventListener(kind, (event) => handler(JSON.parse(event.data)));
  }
  return source;
}

function showStatus(status) {
  const banner = document.getElementById("banner");
  if (status.redis === "ok" || status.redis === "connecting") {
    banner.classList.remove("shown");
    return;
  }
  banner.textContent = (status.redis === "unreachable" ? "Redis unreachable since "
                        : "Cannot read the fleet since ") + clock(status.since_ms, false) +
                       (status.error ? " (" + status.error + ")" : "") +
                       "; retrying. The figures below are the last ones read.";
  banner.classList.add("shown");
}

function breakerLink(name) {
  return "/breakers/" + encodeURIComponent(name);
}

function retryText(b) {
  if (!b) return "-";
  if (b.state === "FORCED_OPEN") return "held open";
  if (b.state === "OPEN") return b.retry_in_s ? "in " + duration(b.retry_in_s) : "probe due";
  if (b.state === "HALF_OPEN") return b.retry_in_s ? "slot in " + duration(b.retry_in_s) : "probe free";
  return "-";
}

// An operator override: FORCED_OPEN, DISABLED, METRICS_ONLY (with its end, when one is stored).
function overrideText(b, nowMs) {
  if (!b || !["FORCED_OPEN", "DISABLED", "METRICS_ONLY"].includes(b.state)) return "";
  if (b.override_until_ms) return "override, ends in " + duration(Math.max(0, b.override_until_ms - nowMs) / 1000);
  return "override";
}

// An adaptive bulkhead limit in words: where it is, why and when it last moved.
function adaptiveText(a, nowMs) {
  const parts = ["adaptive limit " + a.limit.toFixed(3),
                 (a.moved_at_ms ? "last moved " + clock(a.moved_at_ms, true) : "not moved since it started") +
                 ": " + (a.why || "?")];
  if (a.paused_until_ms && a.paused_until_ms > nowMs) {
    parts.push("increases paused for " + duration((a.paused_until_ms - nowMs) / 1000));
  }
  if (a.rtt_short_ms && a.rtt_long_ms) {
    parts.push("latency " + a.rtt_short_ms + " ms last window, " + a.rtt_long_ms + " ms no-load");
  }
  return parts.join("; ");
}
