// The official @anthropic-ai/sdk package against dflash_server: Messages,
// streaming, thinking, tools, count_tokens and errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { baseURL, scripted, model, apiKey, maxTokens, needsScript, weatherTool } from './env.mjs';

const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];
const tools = [{ name: weatherTool.name, description: weatherTool.description, input_schema: weatherTool.parameters }];

test('models.list in Anthropic shape', async () => {
  const page = await client.models.list();
  assert.ok(page.data.length >= 1);
  assert.equal(page.data[0].type, 'model');
  const one = await client.models.retrieve(page.data[0].id);
  assert.equal(one.id, page.data[0].id);
});

test('messages: non-streaming', async () => {
  const msg = await client.messages.create({ model, max_tokens: maxTokens, system: 'Be brief.', messages: user('Say hello.') });
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason));
  assert.ok(msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0);
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('messages: stream helper with text events', async () => {
  const stream = client.messages.stream({ model, max_tokens: maxTokens, messages: user('Say hello.') });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  const finalText = final.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(text, finalText);
  assert.ok(final.usage.output_tokens > 0);
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('messages: raw event sequence follows the grammar', async () => {
  const stream = await client.messages.create({ model, max_tokens: maxTokens, messages: user('Say hello.'), stream: true });
  const types = [];
  let open = null;
  let next = 0;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_start') {
      assert.equal(open, null, 'one block open at a time');
      assert.equal(ev.index, next++);
      open = ev.index;
    } else if (ev.type === 'content_block_delta') {
      assert.equal(ev.index, open);
    } else if (ev.type === 'content_block_stop') {
      assert.equal(ev.index, open);
      open = null;
    }
  }
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-2), 'message_delta');
  assert.equal(types.at(-1), 'message_stop');
});

test('messages: thinking blocks', { skip: needsScript }, async () => {
  const params = { model, max_tokens: 256, thinking: { type: 'enabled', budget_tokens: 128 }, messages: user('2+2? [[reason]]') };
  const msg = await client.messages.create(params);
  assert.deepEqual(msg.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(msg.content[0].thinking, 'Two plus two; that is four.');
  assert.equal(typeof msg.content[0].signature, 'string');
  assert.equal(msg.content[1].text, '2 + 2 = 4');
  const stream = client.messages.stream(params);
  let thinking = '';
  stream.on('thinking', (t) => { thinking += t; });
  const final = await stream.finalMessage();
  assert.equal(thinking, 'Two plus two; that is four.');
  assert.equal(final.content[0].type, 'thinking');
});

test('messages: tool_use round trip, streamed input_json_delta', { skip: needsScript }, async () => {
  const messages = user('Weather in Oslo? [[tool]]');
  const stream = client.messages.stream({ model, max_tokens: maxTokens, tools, messages });
  let partial = '';
  stream.on('inputJson', (delta) => { partial += delta; });
  const first = await stream.finalMessage();
  assert.equal(first.stop_reason, 'tool_use');
  const use = first.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Oslo' });
  assert.deepEqual(JSON.parse(partial), { city: 'Oslo' });
  messages.push({ role: 'assistant', content: first.content });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] });
  const second = await client.messages.create({ model, max_tokens: maxTokens, tools, messages });
  assert.equal(second.stop_reason, 'end_turn');
  assert.equal(second.content[0].text, 'The weather in Oslo is sunny.');
});

test('messages: stop_sequence', { skip: needsScript }, async () => {
  const msg = await client.messages.create({ model, max_tokens: maxTokens, stop_sequences: [', 4'], messages: user('Count [[stop]]') });
  assert.equal(msg.stop_reason, 'stop_sequence');
  assert.equal(msg.stop_sequence, ', 4');
});

test('count_tokens equals the input tokens of the same request', async () => {
  const body = { model, system: 'Be brief.', messages: user('How many tokens is this?') };
  const { input_tokens } = await client.messages.countTokens(body);
  assert.ok(Number.isInteger(input_tokens) && input_tokens > 0);
  const msg = await client.messages.create({ ...body, max_tokens: 1 });
  assert.equal(input_tokens, msg.usage.input_tokens + msg.usage.cache_read_input_tokens);
});

test('messages: 400 for a bad parameter, in Anthropic shape', async () => {
  await assert.rejects(
    client.messages.create({ model, max_tokens: maxTokens, temperature: 5, messages: user('x') }),
    (err) => err instanceof Anthropic.BadRequestError && err.error?.type === 'error'
      && err.error?.error?.type === 'invalid_request_error' && /temperature/.test(err.message),
  );
});

test('messages: 503 is overloaded_error with Retry-After and request-id', { skip: needsScript }, async () => {
  await assert.rejects(
    client.messages.create({ model, max_tokens: maxTokens, messages: user('[[503]]') }),
    (err) => err instanceof Anthropic.InternalServerError && err.status === 503
      && err.error?.error?.type === 'overloaded_error' && err.headers.get('retry-after') === '1'
      && typeof err.requestID === 'string' && err.requestID.length > 0,
  );
});

test('messages: error after the stream started is raised by the SDK', { skip: needsScript }, async () => {
  const stream = client.messages.stream({ model, max_tokens: maxTokens, messages: user('[[fail]]') });
  await assert.rejects(stream.finalMessage(), (err) => /restarted/.test(String(err.message)));
});

test('messages: tool_choice any and tool force a tool_use', async () => {
  const two = [...tools, { name: 'get_time', description: 'Current time', input_schema: { type: 'object' } }];
  for (const [choice, name] of [[{ type: 'any' }, null], [{ type: 'tool', name: 'get_time' }, 'get_time']]) {
    const msg = await client.messages.create({ model, max_tokens: 256, messages: user('Hello there.'), tools: two, tool_choice: choice });
    if (msg.stop_reason === 'max_tokens' && !scripted) continue; // a real model ran out of tokens mid-call
    assert.equal(msg.stop_reason, 'tool_use');
    const use = msg.content.find((b) => b.type === 'tool_use');
    assert.ok(use, 'a tool_use block');
    if (name) assert.equal(use.name, name);
    else assert.ok(['get_weather', 'get_time'].includes(use.name));
    assert.equal(typeof use.input, 'object');
  }
});

test('messages: output_format json_schema gives JSON of the schema', async () => {
  const msg = await client.messages.create({
    model, max_tokens: 256, messages: user('Answer yes or no, in JSON.'),
    output_format: { type: 'json_schema', schema: { type: 'object', properties: { answer: { enum: ['yes', 'no'] } }, required: ['answer'] } },
  });
  if (msg.stop_reason === 'max_tokens' && !scripted) return;
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(['yes', 'no'].includes(JSON.parse(text).answer));
});
