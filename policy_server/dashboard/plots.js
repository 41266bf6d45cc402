// Canvas plots of the dashboard: the current action chunk and the latency timeline.
// Plain 2D canvas, no library: two small plots do not justify shipping one.

const AXIS = "#8796a5";
const GRID = "#222c36";
const PAD = { left: 52, right: 12, top: 12, bottom: 26 };

/** A distinct colour per action dimension (hues spread around the wheel). */
export function dimensionColour(index, count) {
  return `hsl(${Math.round((360 * index) / Math.max(count, 1))}, 70%, 62%)`;
}

function prepare(canvas) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  return ctx;
}

/** Maps data coordinates to canvas pixels inside the padded plot area. */
function scales(canvas, xMin, xMax, yMin, yMax) {
  const w = canvas.width - PAD.left - PAD.right;
  const h = canvas.height - PAD.top - PAD.bottom;
  return {
    x: (v) => PAD.left + ((v - xMin) / (xMax - xMin || 1)) * w,
    y: (v) => PAD.top + h - ((v - yMin) / (yMax - yMin || 1)) * h,
  };
}

function yGrid(ctx, canvas, s, yMin, yMax, unit) {
  ctx.strokeStyle = GRID;
  ctx.fillStyle = AXIS;
  ctx.textAlign = "right";
  for (let i = 0; i <= 4; i++) {
    const v = yMin + ((yMax - yMin) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(PAD.left, s.y(v));
    ctx.lineTo(canvas.width - PAD.right, s.y(v));
    ctx.stroke();
    ctx.fillText(`${+v.toPrecision(3)}${unit}`, PAD.left - 6, s.y(v) + 4);
  }
}

/**
 * The chunk as one line per action dimension over the horizon (step 0 = the observation's moment).
 * `actions` is H rows of D numbers.
 */
export function drawChunk(canvas, actions) {
  const ctx = prepare(canvas);
  const horizon = actions.length;
  const dims = horizon ? actions[0].length : 0;
  const values = actions.flat();
  let yMin = Math.min(...values), yMax = Math.max(...values);
  const margin = (yMax - yMin) * 0.08 || 1;
  yMin -= margin; yMax += margin;
  const s = scales(canvas, 0, Math.max(horizon - 1, 1), yMin, yMax);

  yGrid(ctx, canvas, s, yMin, yMax, "");
  ctx.textAlign = "center";
  for (let step = 0; step < horizon; step += Math.max(1, Math.ceil(horizon / 16))) {
    ctx.fillText(String(step), s.x(step), canvas.height - PAD.bottom + 14);
  }
  ctx.fillText("step of the chunk", (PAD.left + canvas.width) / 2, canvas.height - 2);

  ctx.lineWidth = 1.6;
  for (let d = 0; d < dims; d++) {
    ctx.strokeStyle = dimensionColour(d, dims);
    ctx.beginPath();
    actions.forEach((row, step) => (step ? ctx.lineTo : ctx.moveTo).call(ctx, s.x(step), s.y(row[d])));
    ctx.stroke();
  }
  // Legend: one swatch per dimension along the top edge.
  ctx.textAlign = "left";
  for (let d = 0; d < dims; d++) {
    const x = PAD.left + 8 + d * 44;
    ctx.fillStyle = dimensionColour(d, dims);
    ctx.fillRect(x, PAD.top + 2, 10, 3);
    ctx.fillText(`a${d}`, x + 13, PAD.top + 7);
  }
  ctx.lineWidth = 1;
}

/**
 * Chunk latency over time: a dot per answered observation, dashed p50/p99 lines, and a red tick on
 * the time axis per dropped observation. Times are wall-clock seconds; the window ends at `now` and
 * spans the history shown, between 10 s and `maxWindowS`.
 */
export function drawLatency(canvas, samples, drops, p50, p99, now, maxWindowS = 60) {
  const ctx = prepare(canvas);
  const oldest = Math.min(now, ...samples.map((p) => p.t), ...drops.map((d) => d.t));
  const windowS = Math.min(maxWindowS, Math.max(10, Math.ceil((now - oldest + 1) / 5) * 5));
  const t0 = now - windowS;
  const visible = samples.filter((p) => p.t >= t0);
  const yMax = Math.max(10, ...visible.map((p) => p.total_ms), p99 || 0) * 1.15;
  const s = scales(canvas, t0, now, 0, yMax);

  yGrid(ctx, canvas, s, 0, yMax, " ms");
  ctx.textAlign = "center";
  ctx.fillStyle = AXIS;
  for (let ago = 0; ago <= windowS; ago += windowS / 5) {
    ctx.fillText(ago ? `-${ago}s` : "now", s.x(now - ago), canvas.height - PAD.bottom + 14);
  }

  ctx.strokeStyle = "#4fa3ff";
  ctx.beginPath();
  visible.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, s.x(p.t), s.y(p.total_ms)));
  ctx.stroke();
  ctx.fillStyle = "#4fa3ff";
  for (const p of visible) ctx.fillRect(s.x(p.t) - 1.5, s.y(p.total_ms) - 1.5, 3, 3);

  const line = (value, colour, label) => {
    if (value == null) return;
    ctx.strokeStyle = colour;
    ctx.fillStyle = colour;
    ctx.setLineDash([5, 4]);
    ctx.beginPath();
    ctx.moveTo(PAD.left, s.y(value));
    ctx.lineTo(canvas.width - PAD.right, s.y(value));
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.textAlign = "left";  // at the old end of the window: new points arrive on the right
    ctx.fillText(`${label} ${value.toFixed(1)} ms`, PAD.left + 4, s.y(value) - 4);
  };
  line(p50, "#4caf7a", "p50");
  line(p99, "#f0b429", "p99");

  ctx.fillStyle = "#ef5350";
  const base = canvas.height - PAD.bottom;
  for (const d of drops) if (d.t >= t0) ctx.fillRect(s.x(d.t) - 1, base - 10, 2, 10);
}
