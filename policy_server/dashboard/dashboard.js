// The teleop dashboard: watches live sessions through the observer channel (/v1/observe, JSON frames;
// docs/dashboard.md) and sends the operator's controls. It never talks to /v1/actions/realtime.

import { drawChunk, drawLatency } from "./plots.js";

const $ = (id) => document.getElementById(id);
const state = { ws: null, selected: null, sessions: new Map(), chunkSeq: null, frameSeq: null, promptWhole: false };

// -- connection --------------------------------------------------------------------------------

/** ws(s)://host:port/v1/observe, from config.json (whichever server serves these files writes it). */
async function observerUrl() {
  const override = new URLSearchParams(location.search).get("observer");
  if (override) return override;
  const config = await (await fetch("config.json", { cache: "no-store" })).json();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = new URL(`${scheme}://${location.hostname}:${config.observer_port}${config.observer_path}`);
  // Browsers cannot put an Authorization header on a WebSocket: a token given to the page in its
  // fragment (#token=..., never sent in the page request) travels as ?access_token=.
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token) url.searchParams.set("access_token", token);
  return url.toString();
}

function setConnection(status, text) {
  document.body.dataset.connection = status;
  $("connection").textContent = text;
}

async function connect() {
  let url;
  try {
    url = await observerUrl();
  } catch (err) {
    setConnection("closed", "cannot reach the server");
    setTimeout(connect, 2000);
    return;
  }
  const ws = new WebSocket(url);
  state.ws = ws;
  ws.onopen = () => {
    setConnection("open", "live");
    if (state.selected) send({ type: "subscribe", session_id: state.selected });
  };
  ws.onmessage = (event) => handle(JSON.parse(event.data));
  ws.onclose = () => {
    setConnection("closed", "disconnected, retrying…");
    setTimeout(connect, 1000);
  };
}

function send(frame) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(frame));
}

// -- frames from the server --------------------------------------------------------------------

function handle(frame) {
  switch (frame.type) {
    case "hello":
      $("model").textContent = `${frame.model ?? "model loading"} · ${frame.variant ?? ""}`;
      break;
    case "sessions":
      renderSessions(frame.sessions);
      break;
    case "session_detail":
      if (frame.session_id === state.selected) renderDetail(frame);
      break;
    case "control_result":
      status(`${frame.action} → session is ${frame.state}`);
      break;
    case "error":
      status(`${frame.code}: ${frame.message}`, true);
      break;
  }
}

const fmt = (value, digits = 1, unit = "") => (value == null ? "—" : `${value.toFixed(digits)}${unit}`);

function renderSessions(sessions) {
  state.sessions = new Map(sessions.map((s) => [s.session_id, s]));
  const body = $("sessions").tBodies[0];
  body.replaceChildren(...sessions.map((s) => {
    const row = document.createElement("tr");
    row.dataset.sessionId = s.session_id;
    row.classList.toggle("selected", s.session_id === state.selected);
    const cells = [
      s.session_id, s.domain_name ?? "—", s.action_mode ?? "—", null, fmt(s.control_hz, 0, " Hz"),
      fmt(s.observation_hz, 1), fmt(s.chunk_latency_ms, 1, " ms"),
      `${fmt(s.latency_p50_ms, 0)} / ${fmt(s.latency_p99_ms, 0)} ms`, s.answered, s.dropped,
    ];
    for (const value of cells) {
      const cell = row.insertCell();
      if (value === null) cell.append(stateBadge(s.state));
      else cell.textContent = value;
    }
    row.onclick = () => select(s.session_id);
    return row;
  }));
  $("no-sessions").hidden = sessions.length > 0;
  if (state.selected && !state.sessions.has(state.selected)) {
    $("detail-state").replaceWith(stateBadge("ended", "detail-state"));
    setControlsEnabled(false);
  }
}

function stateBadge(value, id) {
  const badge = document.createElement("span");
  badge.className = `state state-${value}`;
  badge.textContent = value;
  if (id) badge.id = id;
  return badge;
}

function select(sessionId) {
  state.selected = sessionId;
  state.chunkSeq = state.frameSeq = null;
  const summary = state.sessions.get(sessionId);
  $("detail").hidden = false;
  $("detail-id").textContent = sessionId;
  // The sessions list cuts long prompts; the selected session's detail brings the whole one.
  $("prompt").value = summary?.prompt ?? "";
  state.promptWhole = !summary?.prompt_truncated;
  $("camera").removeAttribute("src");
  $("camera-caption").textContent = "no frame yet";
  status("");
  for (const row of $("sessions").tBodies[0].rows) row.classList.toggle("selected", row.dataset.sessionId === sessionId);
  send({ type: "subscribe", session_id: sessionId });
}

function renderDetail(detail) {
  const s = detail.summary;
  $("detail-state").replaceWith(stateBadge(s.state, "detail-state"));
  $("detail").dataset.state = s.state;
  $("detail-reason").textContent = s.state_reason ? `(${s.state_reason})` : "";
  if (!state.promptWhole && document.activeElement !== $("prompt")) {
    $("prompt").value = s.prompt ?? "";
    state.promptWhole = true;
  }
  $("detail-config").textContent =
    `${s.protocol} · ${s.remote ?? ""} · horizon ${s.action_horizon ?? "—"} · prompt “${s.prompt ?? ""}”`;
  setControlsEnabled(s.controllable && s.state !== "stopped");
  // Recording is the server's, not the robot's: every session kind can be recorded while it lives.
  $("record").disabled = s.state === "stopped";
  $("record").textContent = s.recording ? "Stop recording" : "Record";
  $("record").classList.toggle("recording", !!s.recording);
  $("record").dataset.recording = s.recording ? "on" : "off";

  if (detail.frame) {
    $("camera").src = `data:image/jpeg;base64,${detail.frame.jpeg_base64}`;
    $("camera-caption").textContent = `observation ${detail.frame.seq} · shown at ${detail.frame.width}×${detail.frame.height}`;
    state.frameSeq = detail.frame.seq;
  }
  if (detail.chunk && detail.chunk.seq !== state.chunkSeq) {
    const canvas = $("chunk-plot");
    drawChunk(canvas, detail.chunk.actions);
    canvas.dataset.seq = detail.chunk.seq; // tests and curious operators: which chunk is drawn
    state.chunkSeq = detail.chunk.seq;
    $("chunk-caption").textContent =
      `current action chunk: observation ${detail.chunk.seq}, ${detail.chunk.horizon} steps × ${detail.chunk.dim} dimensions`;
  }
  drawLatency($("latency-plot"), detail.latency, detail.dropped, s.latency_p50_ms, s.latency_p99_ms, detail.t);
  $("latency-caption").textContent =
    `chunk latency (arrival → chunk ready): p50 ${fmt(s.latency_p50_ms, 1, " ms")}, ` +
    `p99 ${fmt(s.latency_p99_ms, 1, " ms")} · ${detail.dropped.length} dropped observations (red ticks)`;
}

// -- operator controls -------------------------------------------------------------------------

function status(text, isError = false) {
  $("control-status").textContent = text;
  $("control-status").classList.toggle("error", isError);
}

function setControlsEnabled(enabled) {
  for (const el of $("controls").elements) el.disabled = !enabled;
}

function control(action, extra = {}) {
  if (!state.selected) return;
  send({ type: "control", session_id: state.selected, action, reason: $("reason").value, ...extra });
  status(`${action}…`);
}

$("pause").onclick = () => control("pause");
$("resume").onclick = () => control("resume");
$("stop").onclick = () => {
  if (confirm(`Stop session ${state.selected}? The robot holds and its session ends.`)) control("stop");
};
$("record").onclick = () => control($("record").dataset.recording === "on" ? "stop_recording" : "record");
$("set-prompt").onclick = () => control("set_prompt", { prompt: $("prompt").value });

connect();
