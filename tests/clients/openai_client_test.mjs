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

await assert.rejects(client.completions.create({ ...params, model: 'gpt-4' }),
                     (e) => e.status === 404);
await assert.rejects(client.completions.create({ ...params, max_tokens: 100000 }),
                     (e) => e.status === 400 && /maximum context length/.test(e.message));
const stranger = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
await assert.rejects(stranger.models.list(), (e) => e.status === 401);
console.log('openai client: all checks passed');
