// The live page's start: find out whether the server wants a key (GET /v1/models), ask
// for it when it does, then start the event stream and the playground.

import { auth, getJson, Unauthorized } from './common.js';
import { EngineView } from './engine.js';
import { EventStream } from './events.js';
import { Playground } from './playground.js';

const $ = id => document.getElementById(id);

const playground = new Playground({ onChange: () => engine.timeline.redraw() });
const engine = new EngineView({ mine: request => playground.mine(request) });

function setConn(state, text) {
  const conn = $('conn');
  conn.dataset.state = state;
  conn.textContent = text;
}

const stream = new EventStream({
  onEvent: event => engine.handle(event),
  onState: (state, detail) => {
    if (state === 'connecting') setConn('connecting', 'events: connecting…');
    else if (state === 'open') {
      const replicas = detail.replicas > 1 ? `, ${detail.replicas} replicas` : '';
      setConn('open', `events: live${replicas}${detail.cluster ? ', cluster' : ''}`);
    } else if (state === 'retrying') setConn('retrying', `events: ${detail.why}; again in ${detail.seconds} s`);
    else if (state === 'unauthorized') askForKey('The API key was refused; enter it again.');
    else if (state === 'absent') setConn('retrying', 'this server has no event stream (GET /v1/engine/events is a 404)');
  },
});
engine.onUnauthorized = () => {
  stream.stop();
  askForKey('The API key was refused; enter it again.');
};

function askForKey(message) {
  playground.enable(false);
  setConn('key', 'an API key is needed');
  const form = $('key-form');
  form.hidden = false;
  $('key-error').textContent = message || '';
  $('api-key').focus();
}

// The playground's default max_tokens (128) leaves no room for a prompt in a model whose
// context is that short (stories260K's is 128): the default is clamped to half the context,
// and the field to what the context can hold.
function fitMaxTokens(context) {
  if (!Number.isInteger(context) || context < 2) return;
  const field = $('max-tokens');
  field.max = String(context - 1);
  if (Number(field.value) > context / 2) field.value = String(Math.floor(context / 2));
}

let backoff = 500;

async function connect() {
  try {
    const models = await getJson('/v1/models');
    backoff = 500;
    const keyHadFocus = $('key-form').contains(document.activeElement);
    $('key-form').hidden = true;
    if (keyHadFocus) $('prompt').focus();  // focus does not vanish with the form
    $('model-name').textContent = models.data?.[0]?.id ?? '?';
    fitMaxTokens(models.data?.[0]?.max_model_len);
    document.body.dataset.ready = 'true';
    playground.enable(true);
    stream.start();
  } catch (error) {
    if (error instanceof Unauthorized) {
      askForKey(auth.key ? 'That key was refused.' : '');
      return;
    }
    setConn('retrying', `server: ${error.message}; again in ${backoff / 1000} s`);
    setTimeout(connect, backoff);
    backoff = Math.min(15000, backoff * 2);
  }
}

$('key-form').addEventListener('submit', event => {
  event.preventDefault();
  const input = $('api-key');
  auth.set(input.value);
  input.value = '';
  $('key-error').textContent = '';
  connect();
});

connect();
