// Replay of recorded sessions (/v1/recordings on the HTTP sidecar; docs/recording.md): the camera, the
// chunk plot and the latency timeline of one episode, played from disk as they happened, with seek and
// speed. Rows carry the observation's true arrival time (received_at); frames come in pages of JPEGs.

import { drawChunk, drawLatency } from "./plots.js";

const $ = (id) => document.getElementById(id);
const PAGE = 32; // frames per request (the server's cap)
const player = { episode: null, t: 0, playing: false, last: null, frames: new Map(), pages: new Set(), index: -1 };

/** The page's token (#token=..., as for the observer channel) as a bearer header for the sidecar. */
function headers() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body?.error?.message ?? `${response.status} ${response.statusText}`);
  return body;
}

function listStatus(text, isError = false) {
  $("recordings-status").textContent = text;
  $("recordings-status").classList.toggle("error", isError);
}

async function loadList() {
  let listing;
  try {
    listing = await getJson("../v1/recordings");
  } catch (err) {
    // The WebSocket port serves the dashboard too, but recordings come from the HTTP sidecar.
    listStatus(`recordings unavailable: ${err.message}`, true);
    return;
  }
  const body = $("recordings").tBodies[0];
  body.replaceChildren(...listing.recordings.map((r) => {
    const row = document.createElement("tr");
    row.dataset.name = r.name;
    for (const value of [r.name, r.session, r.started_at, `${(r.bytes / 1024).toFixed(0)} KiB`]) {
      row.insertCell().textContent = value;
    }
    row.onclick = () => open(r.name);
    return row;
  }));
  listStatus(listing.recordings.length ? "" : "No recordings yet.");
}

async function open(name) {
  pause();
  let episode;
  try {
    episode = await getJson(`../v1/recordings/${encodeURIComponent(name)}`);
  } catch (err) {
    listStatus(`${name}: ${err.message}`, true);
    return;
  }
  Object.assign(player, { episode, t: 0, frames: new Map(), pages: new Set(), index: -1 });
  const rows = episode.rows;
  const end = rows.length ? rows[rows.length - 1].received_at : 0;
  $("replay").hidden = false;
  $("replay").dataset.name = name;
  $("replay-name").textContent = name;
  const config = episode.session.config ?? {};
  $("replay-info").textContent =
    `${rows.length} observations · ${end.toFixed(1)} s · ${config.domain_name ?? ""} · prompt “${config.prompt ?? ""}”`;
  $("replay-seek").max = String(end);
  for (const row of $("recordings").tBodies[0].rows) row.classList.toggle("selected", row.dataset.name === name);
  await loadPage(0);
  show(0);
}

async function loadPage(index) {
  const start = Math.floor(index / PAGE) * PAGE;
  if (player.pages.has(start) || !player.episode) return;
  player.pages.add(start);
  const name = player.episode.name;
  try {
    const page = await getJson(`../v1/recordings/${encodeURIComponent(name)}/frames?start=${start}&count=${PAGE}`);
    if (player.episode?.name !== name) return;
    page.frames.forEach((frame, i) => player.frames.set(start + i, frame));
    if (player.index >= start && player.index < start + PAGE) render(player.index, true);
  } catch (err) {
    player.pages.delete(start);
    listStatus(`frames: ${err.message}`, true);
  }
}

/** The last row that had arrived by episode time `t` (-1 before the first). */
function rowAt(t) {
  const rows = player.episode.rows;
  let lo = 0, hi = rows.length - 1, found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (rows[mid].received_at <= t) { found = mid; lo = mid + 1; } else hi = mid - 1;
  }
  return found;
}

function show(t) {
  player.t = t;
  $("replay-seek").value = String(t);
  $("replay-clock").textContent = `${t.toFixed(1)} s`;
  const index = Math.max(0, rowAt(t));
  if (index !== player.index) render(index);
  const next = index + PAGE / 2; // fetch ahead, so playing never waits on a page
  if (next < player.episode.rows.length) loadPage(next);
  loadPage(index);
}

function render(index, frameOnly = false) {
  player.index = index;
  $("replay").dataset.index = String(index);
  const rows = player.episode.rows;
  const row = rows[index];
  if (!row) return;
  const frame = player.frames.get(index);
  const camera = frame && (frame[player.episode.cameras[0]] ?? Object.values(frame)[0]);
  if (camera) {
    $("replay-camera").src = `data:image/jpeg;base64,${camera.jpeg_base64}`;
    $("replay-camera").dataset.index = String(index);
    $("replay-camera-caption").textContent = `observation ${row.seq} · ${row.kind}${row.reason ? ` (${row.reason})` : ""}`;
  }
  if (frameOnly) return;
  let chunk = null;
  for (let i = index; i >= 0 && !chunk; i--) if (rows[i].kind === "chunk") chunk = rows[i];
  const canvas = $("replay-chunk-plot");
  if (chunk && canvas.dataset.seq !== String(chunk.seq)) {
    drawChunk(canvas, chunk.actions);
    canvas.dataset.seq = String(chunk.seq);
    $("replay-chunk-caption").textContent =
      `chunk of observation ${chunk.seq}: ${chunk.actions.length} steps × ${chunk.actions[0]?.length ?? 0} dimensions`;
  }
  const shown = rows.slice(0, index + 1);
  const samples = shown.filter((r) => r.kind === "chunk" && r.timing_ms.total_ms != null)
    .map((r) => ({ t: r.received_at, seq: r.seq, total_ms: r.timing_ms.total_ms }));
  const drops = shown.filter((r) => r.kind === "dropped").map((r) => ({ t: r.received_at, seq: r.seq }));
  const sorted = samples.map((p) => p.total_ms).sort((a, b) => a - b);
  const q = (p) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] : null);
  drawLatency($("replay-latency-plot"), samples, drops, q(0.5), q(0.99), player.t);
  $("replay-latency-plot").dataset.samples = String(samples.length);
  $("replay-latency-caption").textContent =
    `chunk latency as recorded: ${samples.length} chunks, ${drops.length} dropped (red ticks) up to observation ${row.seq}`;
}

function tick(now) {
  if (!player.playing) return;
  const speed = Number($("replay-speed").value);
  const t = player.t + ((now - player.last) / 1000) * speed;
  player.last = now;
  const end = Number($("replay-seek").max);
  show(Math.min(t, end));
  if (t >= end) pause();
  else requestAnimationFrame(tick);
}

function play() {
  if (!player.episode) return;
  if (player.t >= Number($("replay-seek").max)) show(0);
  player.playing = true;
  player.last = performance.now();
  $("replay-play").textContent = "Pause";
  $("replay").dataset.playing = "true";
  requestAnimationFrame(tick);
}

function pause() {
  player.playing = false;
  $("replay-play").textContent = "Play";
  $("replay").dataset.playing = "false";
}

$("replay-play").onclick = () => (player.playing ? pause() : play());
$("replay-seek").oninput = () => player.episode && show(Number($("replay-seek").value));
$("recordings-refresh").onclick = loadList;
loadList();
