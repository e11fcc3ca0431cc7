// The engine panel: the numbers of the latest steps, two sparklines, the timeline, and
// with a cluster the nodes table from GET /v1/cluster.

import { el, fmt, fmtInt, getJson, Unauthorized } from './common.js';
import { Timeline } from './timeline.js';

const WINDOW_MS = 2000;          // rates and step time are over the last two seconds
const SPARK_POINTS = 60;         // one a second
const CLUSTER_POLL_MS = 3000;

class Sparkline {
  constructor(svg, label, unit) {
    this.line = svg.querySelector('polyline');
    this.label = label;
    this.unit = unit;
    this.values = [];
  }

  push(value) {
    this.values.push(value);
    if (this.values.length > SPARK_POINTS) this.values.shift();
    const known = this.values.filter(v => v !== null);
    const max = Math.max(1e-9, ...known);
    const step = 300 / (SPARK_POINTS - 1);
    const offset = SPARK_POINTS - this.values.length;
    const points = [];
    this.values.forEach((v, i) => {
      if (v === null) return;
      const x = (offset + i) * step;
      const y = 38 - (v / max) * 35;
      points.push(`${x.toFixed(1)},${y.toFixed(1)}`);
    });
    this.line.setAttribute('points', points.join(' '));
    const last = this.values[this.values.length - 1];
    this.label.textContent = known.length
      ? `now ${last === null ? '–' : fmt(last)} ${this.unit}, peak ${fmt(Math.max(...known))} ${this.unit}`
      : `no data yet`;
  }
}

export class EngineView {
  constructor({ mine }) {
    this.$ = id => document.getElementById(id);
    this.timeline = new Timeline({
      figure: this.$('timeline'), canvas: this.$('tl-canvas'), tip: this.$('tl-tip'),
      detail: this.$('tl-detail'), mine,
    });
    this.replicas = [];          // latest step event per replica
    this.recent = [];            // {at, gen, prompt, stepMs} of the last WINDOW_MS
    this.dropped = 0;
    this.bucket = { gen: 0, ttftSum: 0, ttftCount: 0 };
    this.sparkGen = new Sparkline(this.$('spark-gen'), this.$('spark-gen-label'), 'tokens/s');
    this.sparkTtft = new Sparkline(this.$('spark-ttft'), this.$('spark-ttft-label'), 'ms');
    this.clusterTimer = 0;
    this.clusterController = null;
    this.onUnauthorized = () => {};
    setInterval(() => this.tickSecond(), 1000);
    setInterval(() => this.renderStats(), 250);

    const pause = this.$('pause');
    pause.addEventListener('click', () => {
      const paused = pause.getAttribute('aria-pressed') !== 'true';
      pause.setAttribute('aria-pressed', String(paused));
      pause.textContent = paused ? 'Resume' : 'Pause';
      this.timeline.setPaused(paused);
    });
    this.$('zoom').addEventListener('change', event => {
      this.timeline.setColumnWidth(Number(event.target.value));
    });
  }

  handle(event) {
    if (event.type === 'hello') this.hello(event);
    else if (event.type === 'step') this.step(event);
  }

  hello(event) {
    this.replicas = new Array(event.replicas || 1).fill(null);
    this.timeline.setReplicas(event.replicas || 1);
    this.watchCluster(Boolean(event.cluster));
  }

  step(event) {
    const r = event.replica || 0;
    this.replicas[r] = event;
    this.timeline.add(event);
    const firsts = event.first_tokens || [];
    const gen = event.generated_tokens;  // tokens sampled in the step
    this.recent.push({ at: performance.now(), gen, prompt: event.prefill_tokens || 0, stepMs: event.step_ms });
    this.bucket.gen += gen;
    for (const f of firsts) { this.bucket.ttftSum += f.ttft_ms; this.bucket.ttftCount++; }
    if (event.dropped) this.dropped += event.dropped;
  }

  tickSecond() {
    const b = this.bucket;
    this.sparkGen.push(b.gen);
    this.sparkTtft.push(b.ttftCount ? b.ttftSum / b.ttftCount : null);
    this.bucket = { gen: 0, ttftSum: 0, ttftCount: 0 };
  }

  renderStats() {
    const now = performance.now();
    while (this.recent.length && now - this.recent[0].at > WINDOW_MS) this.recent.shift();
    const live = this.replicas.filter(Boolean);
    const set = (id, text) => {
      const node = this.$(id);
      if (node.textContent !== text) node.textContent = text;
    };
    if (live.length) {
      const sum = key => live.reduce((s, e) => s + (e[key] || 0), 0);
      const blocks = sum('kv_blocks');
      const kv = blocks ? live.reduce((s, e) => s + e.kv_usage * e.kv_blocks, 0) / blocks
        : sum('kv_usage') / live.length;
      const queried = sum('prefix_queried_tokens');
      set('s-running', fmtInt(sum('running')));
      set('s-waiting', fmtInt(sum('waiting')));
      set('s-kv', fmt(kv * 100, kv * 100 < 10 ? 2 : 1));
      set('s-prefix', queried ? fmt((100 * sum('prefix_hit_tokens')) / queried) : '0.0');
      set('s-preempt', fmtInt(sum('preemptions')));
    }
    const n = this.recent.length;
    const seconds = WINDOW_MS / 1000;
    const gen = this.recent.reduce((s, x) => s + x.gen, 0) / seconds;
    set('s-gen', fmt(gen, 0));
    // The highest rate shown so far, for tests that look after a load has ended.
    const stats = this.$('stats').dataset;
    if (gen > Number(stats.peakGen || 0)) stats.peakGen = String(gen);
    set('s-prompt', fmt(this.recent.reduce((s, x) => s + x.prompt, 0) / seconds, 0));
    set('s-step', n ? fmt(this.recent.reduce((s, x) => s + x.stepMs, 0) / n, 2) : '–');
    set('s-dropped', fmtInt(this.dropped));
    this.$('dropped-tile').classList.toggle('alert', this.dropped > 0);
  }

  watchCluster(on) {
    clearTimeout(this.clusterTimer);
    this.clusterController?.abort();
    this.$('cluster').hidden = !on;
    if (!on) return;
    const poll = async () => {
      this.clusterController = new AbortController();
      try {
        const cluster = await getJson('/v1/cluster', { signal: this.clusterController.signal });
        this.renderCluster(cluster);
      } catch (error) {
        if (error instanceof Unauthorized) { this.onUnauthorized(); return; }
        if (error.status === 404) { this.$('cluster').hidden = true; return; }
        if (error.name === 'AbortError') return;
      }
      this.clusterTimer = setTimeout(poll, CLUSTER_POLL_MS);
    };
    poll();
  }

  renderCluster(cluster) {
    const gib = bytes => (bytes ? (bytes / 2 ** 30).toFixed(1) : '–');
    const nodes = this.$('nodes-table').tBodies[0];
    nodes.replaceChildren(...(cluster.nodes || []).map(n => el('tr', {},
      el('th', { scope: 'row', text: n.name || n.id || '?' }),
      el('td', { text: n.device ?? '–' }),
      el('td', { text: n.cores ?? '–' }),
      el('td', { text: gib(n.memory_bytes) }),
      el('td', { text: (n.gpus || []).length ? n.gpus.map(g => `${g.name} (${gib(g.memory_bytes)} GiB)`).join(', ') : 'none' }),
      el('td', { text: n.replica === undefined || n.replica === null || n.replica < 0 ? '–' : String(n.replica) }),
      el('td', { text: n.ranks ?? '–' }),
      el('td', { text: `${n.slots ?? '–'}${n.unfit ? ` (unfit: ${n.unfit})` : ''}` }),
    )));
    const replicas = this.$('replicas-table').tBodies[0];
    replicas.replaceChildren(...(cluster.replicas || []).map(r => el('tr', {},
      el('th', { scope: 'row', text: String(r.index) }),
      el('td', { text: r.up ? 'up' : 'down' }),
      el('td', { text: r.node === undefined || r.node === '' ? '–' : String(r.node) }),
      el('td', { text: fmtInt(r.num_routed) }),
      el('td', { text: fmtInt(r.num_running) }),
      el('td', { text: fmtInt(r.num_waiting) }),
      el('td', { text: fmt((r.kv_usage || 0) * 100) }),
    )));
  }
}
