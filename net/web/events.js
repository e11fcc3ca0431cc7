// GET /v1/engine/events read with fetch (EventSource cannot send the key): server-sent
// events, one JSON object per `data:` line; lines starting with ':' are keepalives.
// When the stream ends or stalls, it reconnects with a growing delay.

import { auth } from './common.js';

const STALL_MS = 45000;  // three keepalives missed: the connection is gone
const MIN_DELAY_MS = 500;
const LIVED_MS = 5000;  // a stream this old had worked: its end retries soon
const MAX_DELAY_MS = 15000;

export class EventStream {
  // onEvent(object); onState(state, detail): 'connecting' | 'open' | 'retrying' | 'unauthorized'
  // | 'absent' (this server has no event stream)
  constructor({ onEvent, onState }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.delay = MIN_DELAY_MS;
    this.controller = null;
    this.stopped = true;
    this.timer = 0;
    this.openedAt = 0;  // when the current stream said hello
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.delay = MIN_DELAY_MS;
    this.run();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.controller?.abort();
  }

  async run() {
    if (this.stopped) return;
    this.onState('connecting');
    const controller = new AbortController();
    this.controller = controller;
    let lastByte = Date.now();
    const watchdog = setInterval(() => {
      if (Date.now() - lastByte > STALL_MS) controller.abort();
    }, 5000);
    let why = 'the stream ended';
    try {
      const response = await fetch('/v1/engine/events', {
        headers: auth.headers({ Accept: 'text/event-stream' }),
        signal: controller.signal,
        cache: 'no-store',
      });
      if (response.status === 401) {
        this.stopped = true;
        this.onState('unauthorized');
        return;
      }
      if (response.status === 404) {
        this.stopped = true;
        this.onState('absent');
        return;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        lastByte = Date.now();
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          this.dispatch(block);
        }
      }
    } catch (error) {
      why = controller.signal.aborted ? 'no data for a while' : error.message;
    } finally {
      clearInterval(watchdog);
    }
    if (this.stopped) return;
    // Back to a short delay only after a stream that lived: a server (or proxy) that
    // closes right after hello is not asked again every half second.
    if (this.openedAt && performance.now() - this.openedAt > LIVED_MS) this.delay = MIN_DELAY_MS;
    this.openedAt = 0;
    this.onState('retrying', { why, seconds: this.delay / 1000 });
    this.timer = setTimeout(() => this.run(), this.delay);
    this.delay = Math.min(MAX_DELAY_MS, this.delay * 2);
  }

  dispatch(block) {
    let data = '';
    for (const line of block.split('\n')) {
      if (line.startsWith('data:')) data += line.slice(line[5] === ' ' ? 6 : 5);
      // ':' lines are keepalive comments; other fields are not used.
    }
    if (!data) return;
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (event.type === 'hello') {
      this.openedAt = performance.now();
      this.onState('open', event);
    }
    this.onEvent(event);
  }
}
