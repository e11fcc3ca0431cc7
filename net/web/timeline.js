// The engine's steps drawn on a canvas: one column per step (newest at the right), one
// lane group per replica, and in each group a row per request while it lives. A row is
// taken when a request first enters a batch and freed when it finishes, so requests
// joining and leaving a running batch show as rows starting and ending while others go on.

const MAX_COLUMNS = 1500;       // steps kept per replica (the widest view at 2 px)
const STALE_STEPS = 2000;       // a row whose request has not run for this long is freed
const HEADER_H = 16;            // group header text
const STRIP_H = 22;             // tokens per step
const STRIP_GAP = 6;            // between the strip and the lanes
const GROUP_GAP = 10;
const MAX_ROW_H = 12;

function cssColors() {
  const style = getComputedStyle(document.documentElement);
  const get = name => style.getPropertyValue(name).trim() || '#888';
  return {
    prefill: get('--c-prefill'), decode: get('--c-decode'),
    minePrefill: get('--c-mine-prefill'), mineDecode: get('--c-mine-decode'),
    accepted: get('--c-accepted'),
    end: get('--c-end'), abort: get('--c-abort'), gap: get('--c-gap'),
    barPrefill: get('--c-bar-prefill'), barDecode: get('--c-bar-decode'),
    strip: get('--c-strip'), text: get('--c-muted'), select: get('--c-select'),
    lane: get('--c-lane'),
  };
}

class Group {
  constructor(replica) {
    this.replica = replica;
    this.columns = [];
    this.rowOwner = [];          // row -> request id, 0 when free
    this.rowOf = new Map();      // request id -> row
    this.lastSeen = new Map();   // request id -> index of the step it last ran in
    this.count = 0;              // steps received
    this.latest = null;          // the last step event
  }

  take(id) {
    let row = this.rowOwner.indexOf(0);
    if (row < 0) { row = this.rowOwner.length; this.rowOwner.push(0); }
    this.rowOwner[row] = id;
    this.rowOf.set(id, row);
    return row;
  }

  free(id) {
    const row = this.rowOf.get(id);
    if (row === undefined) return;
    this.rowOwner[row] = 0;
    this.rowOf.delete(id);
    this.lastSeen.delete(id);
    while (this.rowOwner.length && this.rowOwner[this.rowOwner.length - 1] === 0) this.rowOwner.pop();
  }

  add(event, gap) {
    const index = this.count++;
    const cells = [];
    for (const item of event.batch || []) {
      const id = item.id;
      const row = this.rowOf.has(id) ? this.rowOf.get(id) : this.take(id);
      this.lastSeen.set(id, index);
      const prefill = item.prefill || 0;
      cells.push({ row, id, prefill, decode: item.decode || 0, drafted: item.drafted || 0, accepted: item.accepted || 0 });
    }
    const ends = [];
    for (const f of event.finished || []) {
      const row = this.rowOf.get(f.id);
      if (row === undefined) continue;
      ends.push({ row, id: f.id, reason: f.reason });
    }
    const firsts = new Map((event.first_tokens || []).map(f => [f.id, f.ttft_ms]));
    this.columns.push({
      step: event.step, time: event.time_ms, stepMs: event.step_ms, roundTripMs: event.round_trip_ms,
      prefill: event.prefill_tokens || 0, decode: event.decode_tokens || 0,
      drafted: event.drafted_tokens || 0, accepted: event.accepted_tokens || 0,
      running: event.running, waiting: event.waiting, kv: event.kv_usage,
      cells, ends, firsts, gap: gap || (event.dropped || 0) > 0, dropped: event.dropped || 0,
    });
    if (this.columns.length > MAX_COLUMNS) this.columns.splice(0, this.columns.length - MAX_COLUMNS);
    for (const e of ends) this.free(e.id);
    if (index % 256 === 0) {
      for (const [id, seen] of this.lastSeen) if (index - seen > STALE_STEPS) this.free(id);
    }
    this.latest = event;
  }

  // After a reconnect the finishes in between are unknown: start the rows afresh.
  forgetRows() {
    this.rowOwner = [];
    this.rowOf.clear();
    this.lastSeen.clear();
  }
}

export class Timeline {
  // figure: holds the canvas and receives data-* counters; mine(id) -> label or null.
  constructor({ figure, canvas, tip, detail, mine }) {
    this.figure = figure;
    this.canvas = canvas;
    this.tip = tip;
    this.detail = detail;
    this.mine = mine;
    this.ctx = canvas.getContext('2d');
    this.groups = [];
    this.colW = 4;
    this.paused = false;
    this.frozen = null;          // the groups' columns as they were when paused
    this.steps = 0;
    this.peakLanes = 0;
    this.selection = null;       // {group, step}
    this.hover = null;           // {group, step}
    this.gapNext = false;
    this.cssW = 0;
    this.cssH = 0;
    this.dirty = true;
    this.colors = cssColors();
    matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => {
      this.colors = cssColors();
      this.dirty = true;
    });
    new ResizeObserver(() => { this.dirty = true; }).observe(figure);
    this.bindInput();
    const loop = () => {
      if (this.dirty) { this.dirty = false; this.draw(); }
      requestAnimationFrame(loop);
    };
    requestAnimationFrame(loop);
  }

  setReplicas(n) {
    if (this.groups.length === n) {
      for (const g of this.groups) g.forgetRows();
      this.gapNext = true;
    } else {
      this.groups = Array.from({ length: n }, (_, i) => new Group(i));
      this.selection = null;
    }
    this.dirty = true;
  }

  add(event) {
    const r = event.replica || 0;
    while (this.groups.length <= r) this.groups.push(new Group(this.groups.length));
    this.groups[r].add(event, this.gapNext);
    this.gapNext = false;
    this.steps++;
    const lanes = (event.batch || []).length;
    if (lanes > this.peakLanes) this.peakLanes = lanes;
    if (!this.paused) this.dirty = true;
  }

  setColumnWidth(px) {
    this.colW = px;
    this.dirty = true;
  }

  setPaused(paused) {
    this.paused = paused;
    this.frozen = paused ? this.groups.map(g => g.columns.slice()) : null;
    this.dirty = true;
  }

  redraw() { this.dirty = true; }

  columnsOf(gi) {
    return this.frozen ? (this.frozen[gi] || []) : this.groups[gi].columns;
  }

  lanesHeight() {
    const narrow = this.cssW < 600;
    if (this.groups.length > 2) return narrow ? 60 : 72;
    return narrow ? 110 : 140;
  }

  groupHeight() { return HEADER_H + STRIP_H + STRIP_GAP + this.lanesHeight() + GROUP_GAP; }

  visibleCount() { return Math.max(1, Math.floor(this.cssW / this.colW)); }

  // The columns of group gi in view, oldest first, with their x positions.
  visible(gi) {
    const columns = this.columnsOf(gi);
    const n = Math.min(columns.length, this.visibleCount());
    return { columns: columns.slice(columns.length - n), x0: this.cssW - n * this.colW };
  }

  resize() {
    const cssW = Math.floor(this.figure.clientWidth);
    const cssH = Math.max(1, this.groups.length) * this.groupHeight();
    if (cssW === this.cssW && cssH === this.cssH) return;
    this.cssW = cssW;
    this.cssH = cssH;
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.max(1, Math.round(cssW * dpr));
    this.canvas.height = Math.round(cssH * dpr);
    this.canvas.style.height = `${cssH}px`;
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  draw() {
    this.resize();
    const { ctx, colors } = this;
    ctx.clearRect(0, 0, this.cssW, this.cssH);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'top';
    let drawn = 0;
    let maxLanes = 0;
    let lanesNow = 0;
    let newest = 0;
    this.groups.forEach((group, gi) => {
      const top = gi * this.groupHeight();
      const { columns, x0 } = this.visible(gi);
      drawn = Math.max(drawn, columns.length);
      const stripTop = top + HEADER_H;
      const lanesTop = stripTop + STRIP_H + STRIP_GAP;
      const lanesH = this.lanesHeight();
      let rows = 1;
      let maxTokens = 1;
      for (const c of columns) {
        for (const cell of c.cells) if (cell.row + 1 > rows) rows = cell.row + 1;
        maxTokens = Math.max(maxTokens, c.prefill + c.decode);
        maxLanes = Math.max(maxLanes, c.cells.length);
      }
      if (columns.length) {
        lanesNow += columns[columns.length - 1].cells.length;
        newest = Math.max(newest, columns[columns.length - 1].step);
      }
      const rowH = Math.min(MAX_ROW_H, lanesH / rows);
      const gapY = rowH >= 5 ? 1 : 0;
      const w = Math.max(1, this.colW - (this.colW >= 4 ? 1 : 0));

      // Header and frames.
      ctx.fillStyle = colors.text;
      ctx.fillText(this.header(group, columns, maxTokens), 0, top + 2);
      ctx.fillStyle = colors.lane;
      ctx.fillRect(0, lanesTop, this.cssW, lanesH);
      ctx.fillStyle = colors.strip;
      ctx.fillRect(0, stripTop, this.cssW, STRIP_H);

      columns.forEach((c, i) => {
        const x = x0 + i * this.colW;
        // Tokens per step: prefill at the bottom, decode on top.
        const hp = (c.prefill / maxTokens) * (STRIP_H - 2);
        const hd = (c.decode / maxTokens) * (STRIP_H - 2);
        ctx.fillStyle = colors.barPrefill;
        ctx.fillRect(x, stripTop + STRIP_H - hp, w, hp);
        ctx.fillStyle = colors.barDecode;
        ctx.fillRect(x, stripTop + STRIP_H - hp - hd, w, hd);
        for (const cell of c.cells) {
          const mine = this.mine(cell.id) !== null;
          const y = lanesTop + cell.row * rowH;
          const full = Math.max(1, rowH - gapY);
          if (cell.prefill > 0) {
            ctx.fillStyle = mine ? colors.minePrefill : colors.prefill;
            ctx.fillRect(x, y, w, full);
          } else {
            const h = full >= 4 ? Math.max(2, Math.round(full * 0.45)) : full;
            ctx.fillStyle = mine ? colors.mineDecode : colors.decode;
            ctx.fillRect(x, y + (full - h) / 2, w, h);
            if (cell.accepted > 0) {
              // Speculative decoding: a line under the decode, as long as the share of its
              // proposed tokens the model accepted.
              ctx.fillStyle = colors.accepted;
              ctx.fillRect(x, y + (full + h) / 2, Math.max(1, w * cell.accepted / cell.drafted), Math.max(1, Math.min(2, (full - h) / 2)));
            }
          }
        }
        for (const end of c.ends) {
          ctx.fillStyle = end.reason === 'abort' || end.reason === 'error' ? colors.abort : colors.end;
          const y = lanesTop + end.row * rowH;
          ctx.fillRect(x + w - Math.min(2, w), y, Math.min(2, w), Math.max(1, rowH - gapY));
        }
        if (c.gap) {
          ctx.fillStyle = colors.gap;
          ctx.fillRect(x - 1, stripTop, 2, STRIP_H + STRIP_GAP + lanesH);
        }
      });

      for (const mark of [this.hover, this.selection]) {
        if (!mark || mark.group !== gi) continue;
        const i = columns.findIndex(c => c.step === mark.step);
        if (i < 0) continue;
        ctx.strokeStyle = colors.select;
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x0 + i * this.colW - 1, stripTop - 1, this.colW + 1, STRIP_H + STRIP_GAP + 2 + lanesH);
      }
    });
    if (!this.groups.length) {
      ctx.fillStyle = colors.text;
      ctx.fillText('waiting for the engine\'s first step…', 4, 4);
    }
    const data = this.figure.dataset;
    data.columns = String(drawn);
    data.steps = String(this.steps);
    data.maxLanes = String(maxLanes);
    data.peakLanes = String(this.peakLanes);
    data.lanes = String(lanesNow);
    data.newestStep = String(newest);
    data.replicas = String(this.groups.length);
    data.paused = String(this.paused);
    this.canvas.setAttribute('aria-label',
      `timeline of the last ${drawn} engine steps${this.groups.length > 1 ? ` on ${this.groups.length} replicas` : ''}; ` +
      `up to ${maxLanes} requests in one step, ${lanesNow} in the newest`);
  }

  header(group, columns, maxTokens) {
    const e = group.latest;
    const name = this.groups.length > 1 ? `replica ${group.replica}` : 'engine';
    if (!e) return `${name}: no steps yet`;
    const kv = (e.kv_usage * 100).toFixed(1);
    const head = `${name} · step ${e.step} · ${e.running} running · ${e.waiting} waiting · KV ${kv} %`;
    if (this.cssW < 560) return head;
    return `${head} · ${e.step_ms.toFixed(1)} ms/step · strip: up to ${maxTokens} tokens/step` +
      (columns.length ? '' : ' · nothing in view');
  }

  // Which group and column a point on the canvas falls on.
  at(clientX, clientY) {
    const rect = this.canvas.getBoundingClientRect();
    const x = clientX - rect.left;
    const y = clientY - rect.top;
    const gi = Math.floor(y / this.groupHeight());
    if (gi < 0 || gi >= this.groups.length) return null;
    const { columns, x0 } = this.visible(gi);
    const i = Math.floor((x - x0) / this.colW);
    if (i < 0 || i >= columns.length) return null;
    return { group: gi, step: columns[i].step, column: columns[i], x, y };
  }

  describe(gi, c) {
    const parts = [];
    const shown = c.cells.slice(0, 8).map(cell => {
      const label = this.mine(cell.id);
      const what = cell.prefill > 0 ? `prefill ${cell.prefill} tokens`
        : cell.drafted > 0 ? `decode 1 token + ${cell.drafted} proposed, ${cell.accepted} accepted`
          : `decode ${cell.decode} token${cell.decode === 1 ? '' : 's'}`;
      return `#${cell.id}${label ? ` (yours: ${label})` : ''} ${what}`;
    });
    if (c.cells.length > 8) shown.push(`and ${c.cells.length - 8} more`);
    parts.push(`${this.groups.length > 1 ? `replica ${gi}, ` : ''}step ${c.step}` +
      ` at ${new Date(c.time).toLocaleTimeString('en-GB')}: ${c.cells.length} request${c.cells.length === 1 ? '' : 's'}, ` +
      `${c.prefill} prefill + ${c.decode} decode tokens, ${c.stepMs.toFixed(2)} ms compute, ` +
      `${c.roundTripMs.toFixed(2)} ms round trip, ${c.running} running, ${c.waiting} waiting, KV ${(c.kv * 100).toFixed(1)} %.` +
      (c.drafted > 0 ? ` Speculative decoding: ${c.accepted} of ${c.drafted} proposed tokens accepted.` : ''));
    if (shown.length) parts.push(shown.join('; ') + '.');
    if (c.firsts.size) parts.push('First tokens: ' + [...c.firsts].map(([id, ms]) => `#${id} ${ms.toFixed(1)} ms`).join(', ') + '.');
    if (c.ends.length) parts.push('Finished: ' + c.ends.map(e => `#${e.id} ${e.reason}`).join(', ') + '.');
    if (c.dropped) parts.push(`${c.dropped} events dropped before this one.`);
    return parts.join(' ');
  }

  bindInput() {
    const canvas = this.canvas;
    canvas.addEventListener('pointermove', event => {
      const hit = this.at(event.clientX, event.clientY);
      this.hover = hit ? { group: hit.group, step: hit.step } : null;
      if (hit) {
        this.tip.textContent = this.describe(hit.group, hit.column);
        this.tip.hidden = false;
        const left = Math.min(Math.max(0, hit.x + 12), Math.max(0, this.cssW - 300));
        this.tip.style.left = `${left}px`;
        this.tip.style.top = `${hit.y + 14}px`;
      } else {
        this.tip.hidden = true;
      }
      this.dirty = true;
    });
    canvas.addEventListener('pointerleave', () => {
      this.hover = null;
      this.tip.hidden = true;
      this.dirty = true;
    });
    canvas.addEventListener('keydown', event => {
      if (!this.groups.length) return;
      let sel = this.selection;
      const gi = sel ? sel.group : 0;
      let { columns } = this.visible(gi);
      if (!columns.length) return;
      let i = sel ? columns.findIndex(c => c.step === sel.step) : columns.length - 1;
      if (i < 0) i = columns.length - 1;
      const step = event.shiftKey ? 10 : 1;
      let g = gi;
      switch (event.key) {
        case 'ArrowLeft': i = Math.max(0, i - step); break;
        case 'ArrowRight': i = Math.min(columns.length - 1, i + step); break;
        case 'Home': i = 0; break;
        case 'End': i = columns.length - 1; break;
        case 'ArrowUp': g = Math.max(0, gi - 1); break;
        case 'ArrowDown': g = Math.min(this.groups.length - 1, gi + 1); break;
        case 'Escape': this.selection = null; this.dirty = true; return;
        default: return;
      }
      event.preventDefault();
      if (g !== gi) {
        columns = this.visible(g).columns;
        if (!columns.length) return;
        i = Math.min(i, columns.length - 1);
      }
      sel = { group: g, step: columns[i].step };
      this.selection = sel;
      this.detail.textContent = this.describe(g, columns[i]);
      this.dirty = true;
    });
  }
}
