// The playground: completions and chats streamed over one WebSocket (/v1/ws), each
// request in its own card with its tokens, time to first token, rate and finish reason.

import { auth, b64url, el, fmt, frameThrottle } from './common.js';

const MAX_COPIES = 16;

class Card {
  constructor(playground, { id, mode, text }) {
    this.playground = playground;
    this.id = id;
    this.mode = mode;
    this.state = 'queued';
    this.tokens = 0;
    this.request = null;        // the engine's number for it, from the first frame
    this.sentAt = performance.now();
    this.firstAt = null;
    this.lastAt = null;
    this.finish = '';
    this.usage = null;
    this.pending = '';
    this.flush = frameThrottle(() => this.render());

    this.stopButton = el('button', { type: 'button', class: 'stop', text: 'Stop', onclick: () => playground.cancel(this) });
    this.stopButton.setAttribute('aria-label', `Stop ${id}`);
    this.removeButton = el('button', { type: 'button', class: 'remove', text: 'Remove', hidden: true, onclick: () => playground.remove(this) });
    this.removeButton.setAttribute('aria-label', `Remove ${id}`);
    this.badge = el('span', { class: 'badge', text: 'queued' });
    this.engineId = el('span', { class: 'engine-id' });
    this.output = el('pre', { class: 'output', tabIndex: 0 });
    this.output.setAttribute('aria-label', `output of ${id}`);
    this.outputText = document.createTextNode('');
    this.output.append(this.outputText);
    this.error = el('p', { class: 'error', hidden: true });
    this.error.setAttribute('role', 'alert');
    this.metric = {};
    const metric = (key, label, unit) => {
      const value = el('span', { class: 'v', text: '–' });
      this.metric[key] = value;
      return el('div', {}, el('dt', { text: label }), el('dd', {}, value, unit ? ` ${unit}` : ''));
    };
    this.node = el('article', { class: 'card', data: { id, state: 'queued', mode, tokens: '0', finishReason: '' } },
      el('header', {},
        el('h3', {}, el('span', { class: 'card-id', text: id }), ' ', el('span', { class: 'mode', text: mode })),
        this.engineId, this.badge, this.stopButton, this.removeButton),
      el('p', { class: 'prompt', text: text, title: text }),
      this.output,
      this.error,
      el('dl', { class: 'metrics' },
        metric('ttft', 'TTFT', 'ms'),
        metric('tokens', 'output', 'tokens'),
        metric('rate', 'rate', 'tokens/s'),
        metric('finish', 'finish', '')),
    );
    this.node.setAttribute('aria-label', `request ${id}`);
  }

  get live() { return this.state === 'queued' || this.state === 'streaming' || this.state === 'stopping'; }

  token(frame) {
    const now = performance.now();
    if (this.firstAt === null) this.firstAt = now;
    this.lastAt = now;
    if (frame.request !== undefined && this.request === null) {
      this.request = frame.request;
      this.playground.byRequest.set(frame.request, this);
    }
    if (this.state === 'queued') this.state = 'streaming';
    if (frame.token !== undefined) this.tokens++;
    if (frame.text) this.pending += frame.text;
    this.flush();
  }

  done(frame) {
    if (frame.token !== undefined || frame.text) this.token(frame);
    this.state = 'done';
    this.finish = frame.finish_reason || 'stop';
    this.usage = frame.usage || null;
    this.render();
    this.playground.ended(this);
  }

  fail(message) {
    this.state = 'error';
    this.finish = this.finish || 'error';
    this.error.textContent = message;
    this.error.hidden = false;
    this.render();
    this.playground.ended(this);
  }

  render() {
    if (this.pending) {
      const out = this.output;
      const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 8;
      this.outputText.appendData(this.pending);
      this.pending = '';
      if (atBottom) out.scrollTop = out.scrollHeight;
    }
    const d = this.node.dataset;
    d.state = this.state;
    d.tokens = String(this.tokens);
    d.finishReason = this.finish;
    if (this.request !== null) {
      d.request = String(this.request);
      this.engineId.textContent = `engine #${this.request}`;
    }
    if (this.firstAt !== null) d.firstTokenAt = String(Math.round(this.firstAt));
    if (!this.live) d.endedAt = String(Math.round(performance.now()));
    this.badge.textContent = this.state === 'done' ? this.finish : this.state;
    this.badge.dataset.kind = this.state === 'done' ? this.finish : this.state;
    this.metric.ttft.textContent = this.firstAt === null ? '–' : fmt(this.firstAt - this.sentAt, 0);
    this.metric.tokens.textContent = String(this.tokens);
    const seconds = this.firstAt === null ? 0 : (this.lastAt - this.firstAt) / 1000;
    this.metric.rate.textContent = this.tokens > 1 && seconds > 0 ? fmt((this.tokens - 1) / seconds, 0) : '–';
    this.metric.finish.textContent = this.finish || '–';
    this.stopButton.hidden = !this.live;
    this.stopButton.disabled = this.state === 'stopping';
    this.removeButton.hidden = this.live;
  }
}

export class Playground {
  constructor({ onChange }) {
    this.$ = id => document.getElementById(id);
    this.onChange = onChange;     // a request's engine number became known or ended
    this.cards = new Map();       // client id -> Card
    this.byRequest = new Map();   // engine number -> Card
    this.ws = null;
    this.opening = null;
    this.counter = 0;
    this.form = this.$('gen-form');
    this.form.addEventListener('submit', event => { event.preventDefault(); this.submit(); });
    this.$('prompt').addEventListener('keydown', event => {
      if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.form.requestSubmit();
      }
    });
    for (const radio of this.form.elements.mode) radio.addEventListener('change', () => this.modeChanged());
    this.$('stop-all').addEventListener('click', () => {
      for (const card of this.cards.values()) if (card.live) this.cancel(card);
    });
    this.$('clear').addEventListener('click', () => {
      for (const card of [...this.cards.values()]) if (!card.live) this.remove(card);
    });
    this.modeChanged();
  }

  enable(on) {
    this.$('send').disabled = !on;
  }

  // The playground's label for an engine request number, or null.
  mine(request) {
    const card = this.byRequest.get(request);
    return card ? card.id : null;
  }

  mode() { return this.form.elements.mode.value; }

  modeChanged() {
    const chat = this.mode() === 'chat';
    this.$('system-row').hidden = !chat;
    this.$('prompt-label').textContent = chat ? 'User message' : 'Prompt';
  }

  // The form's values as a generate message's fields, or a string naming what is wrong.
  params() {
    const number = (id, name, { integer = false, min = -Infinity, max = Infinity, optional = false, above = false } = {}) => {
      const raw = this.$(id).value.trim();
      if (raw === '') {
        if (optional) return undefined;
        throw new Error(`${name} is empty`);
      }
      const x = Number(raw);
      if (!Number.isFinite(x) || (integer && !Number.isInteger(x)) || x < min || x > max || (above && x <= min)) {
        const range = above ? `above ${min}` : `at least ${min}`;
        throw new Error(`${name} must be ${integer ? 'a whole number ' : 'a number '}${range}${max < Infinity ? ` and at most ${max}` : ''}`);
      }
      return x;
    };
    const p = {
      max_tokens: number('max-tokens', 'max_tokens', { integer: true, min: 1 }),
      temperature: number('temperature', 'temperature', { min: 0 }),
      top_p: number('top-p', 'top_p', { min: 0, max: 1, above: true }),
    };
    const topK = number('top-k', 'top_k', { integer: true, min: 0 });
    if (topK > 0) p.top_k = topK;
    const seed = number('seed', 'seed', { integer: true, min: 0, optional: true });
    if (seed !== undefined) p.seed = seed;
    const stop = this.$('stop').value;
    if (stop !== '') p.stop = stop.split('|').filter(s => s !== '');
    if (this.$('ignore-eos').checked) p.ignore_eos = true;
    return { params: p, copies: number('copies', 'copies', { integer: true, min: 1, max: MAX_COPIES }) };
  }

  async submit() {
    if (this.$('send').disabled) return;  // Ctrl+Enter while the page waits for the key
    const error = this.$('form-error');
    error.textContent = '';
    let input;
    try {
      input = this.params();
    } catch (e) {
      error.textContent = e.message;
      return;
    }
    const text = this.$('prompt').value;
    if (text.trim() === '') {
      error.textContent = this.mode() === 'chat' ? 'the user message is empty' : 'the prompt is empty';
      return;
    }
    const mode = this.mode();
    const body = { ...input.params };
    if (mode === 'chat') {
      const system = this.$('system').value.trim();
      body.messages = [...(system ? [{ role: 'system', content: system }] : []), { role: 'user', content: text }];
    } else {
      body.prompt = text;
    }
    const cards = [];
    for (let i = 0; i < input.copies; i++) {
      const card = new Card(this, { id: `p${++this.counter}`, mode, text });
      this.cards.set(card.id, card);
      this.$('cards').prepend(card.node);
      card.render();
      cards.push(card);
    }
    this.updateButtons();
    let ws;
    try {
      ws = await this.socket();
    } catch (e) {
      for (const card of cards) card.fail(e.message);
      return;
    }
    for (const card of cards) {
      if (!card.live) continue;  // stopped while the socket was opening
      card.sentAt = performance.now();
      ws.send(JSON.stringify({ type: 'generate', id: card.id, ...body }));
    }
  }

  socket() {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) return Promise.resolve(this.ws);
    if (this.opening) return this.opening;
    this.opening = new Promise((resolve, reject) => {
      const url = new URL('/v1/ws', location.href);
      url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
      const ws = auth.key
        ? new WebSocket(url, ['troupe', `troupe.bearer.${b64url(auth.key)}`])
        : new WebSocket(url);
      let opened = false;
      ws.addEventListener('open', () => {
        opened = true;
        this.ws = ws;
        this.opening = null;
        resolve(ws);
      });
      ws.addEventListener('message', event => this.frame(event.data));
      ws.addEventListener('close', event => {
        if (this.ws === ws) this.ws = null;
        this.opening = null;
        if (!opened) {
          reject(new Error('could not open the WebSocket /v1/ws (is the API key right?)'));
          return;
        }
        const why = `the socket closed (code ${event.code}${event.reason ? `: ${event.reason}` : ''})`;
        for (const card of this.cards.values()) if (card.live) card.fail(why);
        // A new socket may meet a restarted server, whose numbers start again.
        this.byRequest.clear();
      });
    });
    return this.opening;
  }

  frame(data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    const card = this.cards.get(frame.id);
    if (!card) {
      if (frame.type === 'error') this.$('form-error').textContent = frame.error?.message || 'error';
      return;
    }
    if (frame.type === 'token') card.token(frame);
    else if (frame.type === 'done') card.done(frame);
    else if (frame.type === 'error') {
      const e = frame.error || {};
      card.fail(`${e.code ? `${e.code} ` : ''}${e.type ? `${e.type}: ` : ''}${e.message || 'the request failed'}`);
    }
    if (card.request !== null) this.onChange();
  }

  cancel(card) {
    if (!card.live || card.state === 'stopping') return;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      card.state = 'stopping';
      card.render();
      this.ws.send(JSON.stringify({ type: 'cancel', id: card.id }));
    } else {
      card.finish = 'abort';  // not sent yet: it never will be
      card.fail('stopped before it was sent');
    }
  }

  remove(card) {
    if (card.request !== null) this.byRequest.delete(card.request);
    card.node.remove();
    this.cards.delete(card.id);
    this.updateButtons();
  }

  ended(card) {
    const usage = card.usage ? `, ${card.usage.prompt_tokens} prompt tokens` : '';
    this.$('play-status').textContent = card.state === 'error'
      ? `${card.id} failed`
      : `${card.id} finished (${card.finish}): ${card.tokens} tokens${usage}`;
    this.updateButtons();
    this.onChange();
  }

  updateButtons() {
    this.$('stop-all').disabled = ![...this.cards.values()].some(c => c.live);
  }
}
