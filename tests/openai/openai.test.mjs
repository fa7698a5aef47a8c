// hearth-openai driven by the official OpenAI SDK (pinned in package.json), against a real
// hearthd on the fx-qwen3 fixture: chat whole and streamed, usage, stop, logprobs, tools and
// structured output (the grammar guarantees the shape even on random weights), the error
// shapes and status codes, abort mid-stream, and completions. test_openai.sh starts both
// daemons and passes HEARTH_OPENAI_URL, HEARTH_OPENAI_KEY and HEARTH_SOCKET.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';

const base = process.env.HEARTH_OPENAI_URL;
const key = process.env.HEARTH_OPENAI_KEY;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const model = 'hearth';
const msgs = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name a colour.' },
];

test('models lists the one resident model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].object, 'model');
  assert.ok(list.data[0].id.length > 0);
});

test('chat completion returns an assistant message and usage', async () => {
  const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('greedy chat is deterministic and streaming gives the same text', async () => {
  const a = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, temperature: 0 });
  const stream = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let sawRole = false;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const d = chunk.choices[0].delta;
    if (d.role === 'assistant') sawRole = true;
    if (d.content) text += d.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.ok(sawRole);
  assert.equal(text, a.choices[0].message.content);
  assert.equal(finish, a.choices[0].finish_reason);
  assert.ok(usage && usage.completion_tokens === a.usage.completion_tokens);
});

test('logprobs come with each token and top alternatives', async () => {
  const r = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(Array.isArray(e.bytes));
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
  }
});

test('json_schema response_format yields JSON that fits the schema', async () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 150 } },
    required: ['name', 'age'], additionalProperties: false,
  };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model, messages: msgs, max_tokens: 64, temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
    });
    const v = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(Object.keys(v).sort(), ['age', 'name']);
    assert.equal(typeof v.name, 'string');
    assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 150);
  }
});

test('tool_choice required makes a structured tool call with schema-valid arguments', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'Current weather',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] },
    },
  }];
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'required',
    max_tokens: 96, temperature: 0.7, seed: 7,
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.tool_calls.length >= 1, true);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');

  // The same through the stream: the call arrives as a structured delta, never as text.
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'required',
    max_tokens: 96, temperature: 0.7, seed: 7, stream: true,
  });
  let calls = 0;
  let text = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    if (d?.tool_calls) calls += d.tool_calls.length;
    if (d?.content) text += d.content;
  }
  assert.ok(calls >= 1);
  assert.ok(!text.includes('<tool_call>'));
});

test('an unknown parameter is a 400 naming it, in OpenAI error shape', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: msgs, max_tokens: 2, bogus_field: 1 }),
    (e) => e.status === 400 && e.error?.param === 'bogus_field' && e.error?.type === 'invalid_request_error');
  await assert.rejects(
    client.chat.completions.create({ model, messages: msgs, n: 2 }),
    (e) => e.status === 400 && e.error?.param === 'n');
  await assert.rejects(
    client.chat.completions.create({ model, messages: [] }),
    (e) => e.status === 400 && e.error?.param === 'messages');
});

test('a wrong API key is a 401', async () => {
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-the-key-at-all', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.error?.code === 'invalid_api_key');
});

test('aborting a stream ends the request in hearthd', async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model, messages: msgs, max_tokens: 4000, temperature: 0.8, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) n++;
      if (n >= 2) ac.abort();
    }
  } catch (e) {
    assert.ok(e.name === 'APIUserAbortError' || e.name === 'AbortError', e.name);
  }
  // hearthd must see no running sequence soon after (one step, plus the client's teardown).
  const deadline = Date.now() + 3000;
  let running = -1;
  while (Date.now() < deadline) {
    const out = execFileSync(process.env.HEARTH_CLI, ['--socket', process.env.HEARTH_SOCKET, 'stats'], { encoding: 'utf8' });
    running = Number(/running\D*(\d+)/.exec(out)?.[1]);
    if (running === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(running, 0);
});

test('embeddings: a generative model needs a pooling; with one, unit vectors in order, base64 as float, as the CLI', async () => {
  await assert.rejects(client.embeddings.create({ model, input: 'hello' }),
    (e) => e.status === 400 && /pooling_type is unspecified/.test(e.error?.message ?? ''));
  const input = ['hello world', 'a second, longer input to embed', 'x'];
  // Without encoding_format the SDK asks for base64 and decodes it to floats itself.
  const b64 = await client.embeddings.create({ model, input, pooling: 'mean' });
  const fl = await client.embeddings.create({ model, input, pooling: 'mean', encoding_format: 'float' });
  assert.equal(fl.object, 'list');
  assert.equal(fl.data.length, 3);
  assert.ok(fl.usage.prompt_tokens > 0);
  assert.equal(b64.usage.prompt_tokens, fl.usage.prompt_tokens);
  const cli = JSON.parse(execFileSync(process.env.HEARTH_CLI,
    ['--socket', process.env.HEARTH_SOCKET, 'embed', '--pooling', 'mean', ...input], { encoding: 'utf8' }));
  assert.equal(cli.usage.prompt_tokens, fl.usage.prompt_tokens);
  fl.data.forEach((d, i) => {
    assert.equal(d.index, i);
    const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
    assert.deepEqual(Array.from(b64.data[i].embedding), d.embedding);
    d.embedding.forEach((x, k) => assert.ok(Math.abs(x - cli.data[i].embedding[k]) < 1e-6));
  });
});

test('completions continue a prompt, whole and streamed alike', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});
