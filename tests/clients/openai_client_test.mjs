// The official `openai` npm client against a running troupe server.
// Usage: node openai_client_test.mjs http://127.0.0.1:PORT
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
const stranger = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(stranger.models.list(), (e) => e.status === 401);
console.log('openai client: all checks passed');
