// The official `openai` npm client against a running troupe server.
// Usage: node openai_client_test.mjs http://127.0.0.1:PORT [REASONING_URL]
// REASONING_URL: a server under --reasoning-parser deepseek_r1 whose template opens <think>.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-test', maxRetries: 0 });

const models = await client.models.list();
assert.equal(models.data[0].id, 'troupe');

const params = { model: 'troupe', prompt: 'Once upon a time', max_tokens: 6, temperature: 0 };
const completion = await client.completions.create(params);
assert.equal(completion.object, 'text_completion');
assert.equal(completion.usage.completion_tokens, 6);
assert.equal(completion.choices[0].finish_reason, 'length');

let streamed = '';
let finish = null;
for await (const chunk of await client.completions.create({ ...params, stream: true })) {
  streamed += chunk.choices[0]?.text ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
assert.equal(streamed, completion.choices[0].text);
assert.equal(finish, 'length');

const chatParams = { model: 'troupe', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 5, temperature: 0 };
const chat = await client.chat.completions.create(chatParams);
assert.equal(chat.choices[0].message.role, 'assistant');
let chatStreamed = '';
let usage = null;
for await (const chunk of await client.chat.completions.create({
  ...chatParams, stream: true, stream_options: { include_usage: true } })) {
  chatStreamed += chunk.choices[0]?.delta?.content ?? '';
  usage = chunk.usage ?? usage;
}
assert.equal(chatStreamed, chat.choices[0].message.content);
assert.equal(usage.completion_tokens, 5);

// Structured outputs and tool calls: the random model's free output is gibberish, so
// anything well-formed here comes from the constraint.
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } },
                  required: ['city'] },
  },
};
const toolParams = {
  model: 'troupe', messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_tokens: 100,
  temperature: 0, tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } },
};
const called = await client.chat.completions.create(toolParams);
assert.equal(called.choices[0].finish_reason, 'tool_calls');
assert.equal(called.choices[0].message.content, null);
const call = called.choices[0].message.tool_calls[0];
assert.equal(call.type, 'function');
assert.equal(call.function.name, 'get_weather');
assert.match(call.id, /^call_/);
assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
// Streamed: the same call (greedy), put together from the deltas as the client does.
const streamedCalls = [];
let toolFinish = null;
for await (const chunk of await client.chat.completions.create({ ...toolParams, stream: true })) {
  for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
    streamedCalls[d.index] ??= { name: '', arguments: '' };
    streamedCalls[d.index].name += d.function?.name ?? '';
    streamedCalls[d.index].arguments += d.function?.arguments ?? '';
  }
  toolFinish = chunk.choices[0]?.finish_reason ?? toolFinish;
}
assert.equal(toolFinish, 'tool_calls');
assert.deepEqual(streamedCalls, [{ name: 'get_weather', arguments: call.function.arguments }]);
// tool_choice "required": a call of one of the tools.
const required = await client.chat.completions.create({ ...toolParams, tool_choice: 'required' });
assert.equal(required.choices[0].finish_reason, 'tool_calls');
assert.equal(required.choices[0].message.tool_calls[0].function.name, 'get_weather');
// The call and the tool's answer go back into the history.
const followUp = await client.chat.completions.create({
  model: 'troupe', max_tokens: 5, temperature: 0, tools: [weather],
  messages: [toolParams.messages[0], called.choices[0].message,
             { role: 'tool', tool_call_id: call.id, content: '{"celsius": 3}' }],
});
assert.equal(followUp.choices[0].message.role, 'assistant');
// response_format json_schema, strict.
const structured = await client.chat.completions.create({
  ...chatParams, max_tokens: 60,
  response_format: {
    type: 'json_schema',
    json_schema: { name: 'answer', strict: true,
                   schema: { type: 'object', properties: { answer: { type: 'integer' } },
                             required: ['answer'], additionalProperties: false } },
  },
});
assert.equal(structured.choices[0].finish_reason, 'stop');
assert.equal(typeof JSON.parse(structured.choices[0].message.content).answer, 'number');
await assert.rejects(
  client.chat.completions.create({ ...chatParams, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { not: { type: 'string' } } } } }),
  (e) => e.status === 400 && /not/.test(e.message));

await assert.rejects(client.completions.create({ ...params, model: 'gpt-4' }),
                     (e) => e.status === 404);
await assert.rejects(client.completions.create({ ...params, max_tokens: 100000 }),
                     (e) => e.status === 400 && /maximum context length/.test(e.message));
// The rest of the OpenAI surface.
const retrieved = await client.models.retrieve('troupe');
assert.equal(retrieved.id, 'troupe');
await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404);

// logprobs 0: each token's own, alone in its top_logprobs, with text offsets.
const scored = await client.completions.create({ ...params, logprobs: 0 });
const lp = scored.choices[0].logprobs;
assert.equal(scored.choices[0].text, completion.choices[0].text);
assert.equal(lp.tokens.length, 6);
assert.equal(lp.token_logprobs.length, 6);
lp.top_logprobs.forEach((top, i) => {
  assert.equal(Object.keys(top).length, 1);
  assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
});
// Each token's text_offset points at its text in the choice's text.
const startsAt = (text, logprobs, from) => logprobs.tokens.slice(from).forEach((token, i) => {
  assert.ok(text.slice(logprobs.text_offset[from + i]).startsWith(token), `${token} at ${i}`);
});
startsAt(scored.choices[0].text, lp, 0);

// echo: the prompt, then the output; with logprobs, the prompt's first token has none.
const echoed = await client.completions.create({ ...params, echo: true, logprobs: 1 });
assert.equal(echoed.choices[0].text, params.prompt + completion.choices[0].text);
const elp = echoed.choices[0].logprobs;
assert.equal(elp.token_logprobs[0], null);
assert.equal(elp.top_logprobs[0], null);
assert.equal(elp.tokens.length, echoed.usage.prompt_tokens + 6);
assert.ok(elp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0));
startsAt(echoed.choices[0].text, elp, echoed.usage.prompt_tokens);
assert.equal(elp.text_offset[echoed.usage.prompt_tokens], params.prompt.length);
let echoStreamed = '';
const streamedOffsets = [];
for await (const chunk of await client.completions.create({
  ...params, echo: true, stream: true, logprobs: 0 })) {
  const choice = chunk.choices[0];
  if (choice?.logprobs && echoStreamed.length > 0) {
    streamedOffsets.push([choice.logprobs.text_offset[0], choice.logprobs.tokens[0]]);
  }
  echoStreamed += choice?.text ?? '';
}
assert.equal(echoStreamed, echoed.choices[0].text);
assert.equal(streamedOffsets.length, 6);
for (const [offset, token] of streamedOffsets) assert.ok(echoStreamed.slice(offset).startsWith(token));
// vLLM's prompt_logprobs: null, then one map per prompt position.
const promptScored = await client.completions.create({ ...params, prompt_logprobs: 2 });
const plp = promptScored.choices[0].prompt_logprobs;
assert.equal(plp.length, promptScored.usage.prompt_tokens);
assert.equal(plp[0], null);
for (const position of plp.slice(1)) {
  const entries = Object.values(position);
  assert.ok(entries.length >= 2 && entries.length <= 3);
  assert.ok(entries.every((e) => e.logprob <= 0 && e.rank >= 1 && typeof e.decoded_token === 'string'));
}

// A batch of prompts (texts, or token lists): n choices for each, prompt-major.
const batch = await client.completions.create({
  model: 'troupe', prompt: [params.prompt, 'Hello'], max_tokens: 6, temperature: 0, n: 2 });
assert.equal(batch.choices.length, 4);
assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3]);
assert.equal(batch.choices[0].text, completion.choices[0].text);
assert.equal(batch.choices[1].text, completion.choices[0].text);
const hello = await client.completions.create({ ...params, prompt: 'Hello' });
assert.equal(batch.choices[2].text, hello.choices[0].text);
assert.equal(batch.usage.prompt_tokens, completion.usage.prompt_tokens + hello.usage.prompt_tokens);
assert.equal(batch.usage.completion_tokens, 24);
const ids = await client.completions.create({ model: 'troupe', prompt: [[5, 6, 7], [8, 9]], max_tokens: 2 });
assert.equal(ids.choices.length, 2);
assert.equal(ids.usage.prompt_tokens, 5);

// best_of: the candidate with the highest cumulative logprob among n=best_of's.
const sampling = { ...params, temperature: 1.5, seed: 11 };
const candidates = await client.completions.create({ ...sampling, n: 4, logprobs: 0 });
const sums = candidates.choices.map((c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0));
const best = await client.completions.create({ ...sampling, best_of: 4 });
assert.equal(best.choices.length, 1);
assert.equal(best.choices[0].text, candidates.choices[sums.indexOf(Math.max(...sums))].text);
await assert.rejects(client.completions.create({ ...params, n: 2, best_of: 1 }),
                     (e) => e.status === 400 && /best_of/.test(e.message));
await assert.rejects(client.completions.create({ ...params, best_of: 2, stream: true }),
                     (e) => e.status === 400);

// logit_bias: +100 all but forces a token, out of the vocabulary is a 400.
const forced = await client.completions.create({ ...params, logit_bias: { 300: 100 } });
const detok = await fetch(`${base}/detokenize`, {
  method: 'POST', headers: { Authorization: 'Bearer sk-test', 'Content-Type': 'application/json' },
  body: JSON.stringify({ tokens: [300, 300, 300, 300, 300, 300] }) });
assert.equal(forced.choices[0].text, (await detok.json()).prompt);
await assert.rejects(client.completions.create({ ...params, logit_bias: { 99999: 1 } }),
                     (e) => e.status === 400 && /logit_bias/.test(e.message));
// suffix: this model has no fill-in-the-middle tokens.
await assert.rejects(client.completions.create({ ...params, suffix: 'The end.' }),
                     (e) => e.status === 400 && /fill-in-the-middle/.test(e.message));
await assert.rejects(client.completions.create({ ...params, top_a: 1 }),
                     (e) => e.status === 400 && /top_a/.test(e.message));

// CORS, as a browser page at another origin calls it.
const preflight = await fetch(`${base}/v1/completions`, { method: 'OPTIONS', headers: {
  Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST',
  'Access-Control-Request-Headers': 'authorization, content-type' } });
assert.equal(preflight.status, 200);
assert.equal(preflight.headers.get('access-control-allow-origin'), '*');
assert.equal(preflight.headers.get('access-control-allow-headers'), 'authorization, content-type');
const crossOrigin = await fetch(`${base}/v1/models`, {
  headers: { Authorization: 'Bearer sk-test', Origin: 'https://app.example' } });
assert.equal(crossOrigin.headers.get('access-control-allow-origin'), '*');
assert.equal(crossOrigin.headers.get('access-control-expose-headers'), 'X-Request-Id');

const stranger = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(stranger.models.list(), (e) => e.status === 401);
// The Responses API: an output_text item, whole and streamed as typed events.
const respParams = { model: 'troupe', instructions: 'Answer briefly.', input: 'Hello!',
                     max_output_tokens: 6, temperature: 0 };
const resp = await client.responses.create(respParams);
assert.equal(resp.object, 'response');
assert.equal(resp.status, 'incomplete');  // max_output_tokens ended it
assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
assert.equal(resp.output[0].type, 'message');
assert.equal(resp.output[0].content[0].type, 'output_text');
assert.equal(typeof resp.output_text, 'string');
assert.ok(resp.output_text.length > 0);
assert.equal(resp.usage.output_tokens, 6);
const eventTypes = [];
let respStreamed = '';
let lastResponse = null;
for await (const event of await client.responses.create({ ...respParams, stream: true })) {
  eventTypes.push(event.type);
  if (event.type === 'response.output_text.delta') respStreamed += event.delta;
  if (event.response) lastResponse = event.response;
}
assert.equal(eventTypes[0], 'response.created');
assert.equal(eventTypes.at(-1), 'response.incomplete');
for (const type of ['response.output_item.added', 'response.content_part.added',
                    'response.output_text.done', 'response.output_item.done']) {
  assert.ok(eventTypes.includes(type), type);
}
assert.equal(respStreamed, resp.output_text);
assert.equal(lastResponse.output[0].content[0].text, resp.output_text);
// A forced function call comes back as a function_call item.
const respCall = await client.responses.create({
  model: 'troupe', input: 'Weather in Oslo?', max_output_tokens: 100, temperature: 0,
  tools: [{ type: 'function', name: 'get_weather', parameters: weather.function.parameters }],
  tool_choice: { type: 'function', name: 'get_weather' } });
const fc = respCall.output.find((item) => item.type === 'function_call');
assert.equal(fc.name, 'get_weather');
assert.match(fc.call_id, /^call_/);
assert.equal(typeof JSON.parse(fc.arguments).city, 'string');
// Nothing is stored: previous_response_id is a 404, as vLLM's without its store.
await assert.rejects(client.responses.create({ ...respParams, previous_response_id: resp.id }),
                     (e) => e.status === 404 && /not found/.test(e.message));

// A reasoning model's thinking, apart from its answer: whole and streamed alike.
if (process.argv[3]) {
  const thinker = new OpenAI({ baseURL: `${process.argv[3]}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  const thinkParams = { model: 'troupe', messages: [{ role: 'user', content: 'Why?' }], max_tokens: 8,
                        seed: 7, ignore_eos: true };  // temperature 0 writes only newlines
  const thought = await thinker.chat.completions.create(thinkParams);
  const reasoning = thought.choices[0].message.reasoning_content;
  assert.equal(typeof reasoning, 'string');
  assert.ok(reasoning.length > 0);
  assert.equal(thought.choices[0].message.content, null);  // no </think>: no answer yet
  let streamedReasoning = '';
  let streamedContent = '';
  for await (const chunk of await thinker.chat.completions.create({ ...thinkParams, stream: true })) {
    streamedReasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
    streamedContent += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(streamedReasoning, reasoning);
  assert.equal(streamedContent, '');
  // In the Responses API, a reasoning item with its reasoning_text.
  const thoughtResp = await thinker.responses.create({ model: 'troupe', input: 'Why?', max_output_tokens: 8,
                                                       seed: 7, ignore_eos: true });
  assert.equal(thoughtResp.output[0].type, 'reasoning');
  assert.equal(thoughtResp.output[0].content[0].text, reasoning);
}
console.log('openai client: all checks passed');
