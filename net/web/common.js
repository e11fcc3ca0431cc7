// Shared by the live page's modules: the API key (held in memory only, never stored),
// requests that carry it, and small DOM and number helpers.

let apiKey = null;

export const auth = {
  get key() { return apiKey; },
  set(key) { apiKey = key || null; },
  headers(extra = {}) {
    return apiKey ? { ...extra, Authorization: `Bearer ${apiKey}` } : { ...extra };
  },
};

// Unpadded base64url of the UTF-8 bytes (RFC 4648 §5): the key as a WebSocket subprotocol.
export function b64url(text) {
  let binary = '';
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

export class Unauthorized extends Error {}

// GET a /v1 route as JSON with the key. 401 throws Unauthorized; other failures Error.
export async function getJson(path, { signal } = {}) {
  const response = await fetch(path, { headers: auth.headers(), signal, cache: 'no-store' });
  if (response.status === 401) throw new Unauthorized('the API key was refused');
  if (!response.ok) {
    const error = new Error(`${path}: HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

// el('p', {class: 'x', text: 'hi', data: {id: 1}, attrs: {...}}, child, ...)
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (name === 'class') node.className = value;
    else if (name === 'text') node.textContent = value;
    else if (name === 'data') Object.assign(node.dataset, value);
    else if (name === 'attrs') for (const [a, v] of Object.entries(value)) node.setAttribute(a, v);
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// Numbers as the page prints them: a few significant digits, no trailing noise.
export function fmt(x, digits = 1) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  if (Math.abs(x) >= 100) return Math.round(x).toLocaleString('en-US');
  return x.toFixed(digits);
}

export function fmtInt(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  return Math.round(x).toLocaleString('en-US');
}

// Calls fn at most once per animation frame, however often it is asked.
export function frameThrottle(fn) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; fn(); });
  };
}
