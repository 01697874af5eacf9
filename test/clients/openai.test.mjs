// The official openai package against dflash_server: Chat Completions,
// Responses, models and errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { baseURL, scripted, model, apiKey, maxTokens, needsScript, weatherTool } from './env.mjs';

const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];

test('models.list names the loaded models', async () => {
  const page = await client.models.list();
  assert.ok(page.data.length >= 1);
  for (const m of page.data) {
    assert.equal(m.object, 'model');
    assert.equal(typeof m.id, 'string');
    assert.ok(m.id.length > 0);
  }
  const one = await client.models.retrieve(page.data[0].id);
  assert.equal(one.id, page.data[0].id);
});

test('chat: non-streaming completion', async () => {
  const res = await client.chat.completions.create({ model, messages: user('Say hello.'), max_tokens: maxTokens });
  assert.equal(res.object, 'chat.completion');
  assert.equal(res.choices.length, 1);
  const choice = res.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  assert.ok(res.usage.prompt_tokens > 0);
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  if (scripted) assert.equal(choice.message.content, 'Hello from dflash! 😀 You said: Say hello.');
});

test('chat: streaming with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model, messages: user('Count to three.'), max_tokens: maxTokens, stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason != null);
  assert.equal(finishes.length, 1, 'exactly one finish_reason');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.ok(last.usage.completion_tokens > 0);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
  const text = chunks.flatMap((c) => c.choices).map((c) => c.delta.content ?? '').join('');
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Count to three.');
});

test('chat: stream helper assembles the final message', async () => {
  const runner = client.chat.completions.stream({ model, messages: user('Hi.'), max_tokens: maxTokens });
  const final = await runner.finalChatCompletion();
  assert.equal(typeof final.choices[0].message.content, 'string');
  if (scripted) assert.equal(final.choices[0].message.content, 'Hello from dflash! 😀 You said: Hi.');
});

test('chat: tool-call round trip', { skip: needsScript }, async () => {
  const tools = [{ type: 'function', function: weatherTool }];
  const messages = user('Weather in Oslo? [[tool]]');
  const first = await client.chat.completions.create({ model, messages, tools, max_tokens: maxTokens });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Oslo' });
  messages.push(choice.message, { role: 'tool', tool_call_id: call.id, content: 'sunny' });
  const second = await client.chat.completions.create({ model, messages, tools, max_tokens: maxTokens });
  assert.equal(second.choices[0].message.content, 'The weather in Oslo is sunny.');
  assert.equal(second.choices[0].finish_reason, 'stop');
});

test('chat: tool call streamed in pieces', { skip: needsScript }, async () => {
  const stream = await client.chat.completions.create({
    model, messages: user('Weather? [[tool]]'), tools: [{ type: 'function', function: weatherTool }],
    max_tokens: maxTokens, stream: true,
  });
  const calls = [];
  let finish;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      for (const d of choice.delta.tool_calls ?? []) {
        if (d.id) {
          assert.equal(d.type, 'function');
          calls[d.index] = { id: d.id, name: d.function.name, args: d.function.arguments ?? '' };
        } else {
          calls[d.index].args += d.function.arguments;
        }
      }
      finish = choice.finish_reason ?? finish;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].args), { city: 'Oslo' });
});

test('chat: reasoning_content in message and deltas', { skip: needsScript }, async () => {
  const res = await client.chat.completions.create({ model, messages: user('2+2? [[reason]]'), max_tokens: maxTokens, reasoning_effort: 'low' });
  assert.equal(res.choices[0].message.reasoning_content, 'Two plus two; that is four.');
  assert.equal(res.choices[0].message.content, '2 + 2 = 4');
  assert.equal(res.usage.completion_tokens_details.reasoning_tokens, 2);
  const stream = await client.chat.completions.create({ model, messages: user('2+2? [[reason]]'), max_tokens: maxTokens, stream: true });
  let reasoning = '';
  let content = '';
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      reasoning += c.delta.reasoning_content ?? '';
      content += c.delta.content ?? '';
    }
  }
  assert.equal(reasoning, 'Two plus two; that is four.');
  assert.equal(content, '2 + 2 = 4');
});

test('chat: finish_reason length', { skip: needsScript }, async () => {
  const res = await client.chat.completions.create({ model, messages: user('Go on [[long]]'), max_tokens: 4 });
  assert.equal(res.choices[0].finish_reason, 'length');
});

test('chat: error after the stream started is raised by the SDK', { skip: needsScript }, async () => {
  const stream = await client.chat.completions.create({ model, messages: user('[[fail]]'), max_tokens: maxTokens, stream: true });
  let text = '';
  await assert.rejects(async () => {
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  }, (err) => err instanceof OpenAI.APIError && /restarted/.test(err.message));
  assert.equal(text, 'Partial');
});

test('chat: 400 names the bad parameter', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('x'), temperature: 5 }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.error?.param === 'temperature'
      && err.type === 'invalid_request_error',
  );
});

test('chat: 503 carries Retry-After and the reject reason', { skip: needsScript }, async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('[[503]]') }),
    (err) => err instanceof OpenAI.InternalServerError && err.status === 503 && err.code === 'queue_full'
      && err.headers.get('retry-after') === '1' && err.headers.get('x-dflash-reject-reason') === 'queue-full',
  );
});

test('chat: the SDK retries a 503 after Retry-After', { skip: needsScript }, async () => {
  const retrying = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 2 });
  const nonce = `[[503-once:${Date.now()}-${Math.random()}]]`;
  const { data, response } = await retrying.chat.completions.create({ model, messages: user(nonce) }).withResponse();
  assert.equal(response.status, 200);
  assert.ok(data.choices[0].message.content.endsWith(nonce));
});

test('chat: never-fits is a 400', { skip: needsScript }, async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('[[never_fits]]') }),
    (err) => err instanceof OpenAI.BadRequestError && err.code === 'context_length_exceeded',
  );
});

test('responses: non-streaming', async () => {
  const res = await client.responses.create({ model, input: 'Say hello.', instructions: 'Be brief.', max_output_tokens: maxTokens });
  assert.equal(res.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(res.status));
  assert.equal(typeof res.output_text, 'string');
  assert.ok(res.usage.input_tokens > 0);
  if (scripted) assert.equal(res.output_text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('responses: streaming events are numbered and end with one terminal event', async () => {
  const stream = await client.responses.create({ model, input: 'Say hello.', max_output_tokens: maxTokens, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  events.forEach((ev, i) => assert.equal(ev.sequence_number, i));
  assert.equal(events[0].type, 'response.created');
  const terminal = events.filter((e) => ['response.completed', 'response.incomplete', 'response.failed'].includes(e.type));
  assert.equal(terminal.length, 1);
  assert.equal(terminal[0], events.at(-1));
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('responses: stream helper with reasoning and a function call', { skip: needsScript }, async () => {
  const reasoning = client.responses.stream({ model, input: '2+2? [[reason]]', max_output_tokens: maxTokens, reasoning: { effort: 'low' } });
  const r = await reasoning.finalResponse();
  assert.equal(r.output_text, '2 + 2 = 4');
  assert.equal(r.output[0].type, 'reasoning');
  assert.equal(r.output[0].content[0].text, 'Two plus two; that is four.');

  const tools = [{ type: 'function', ...weatherTool }];
  const call = client.responses.stream({ model, input: 'Weather? [[tool]]', tools, max_output_tokens: maxTokens });
  const c = await call.finalResponse();
  const fc = c.output.find((o) => o.type === 'function_call');
  assert.equal(fc.name, 'get_weather');
  assert.deepEqual(JSON.parse(fc.arguments), { city: 'Oslo' });
  const back = await client.responses.create({
    model, tools, max_output_tokens: maxTokens,
    input: [{ role: 'user', content: 'Weather? [[tool]]' }, fc, { type: 'function_call_output', call_id: fc.call_id, output: 'rainy' }],
  });
  assert.equal(back.output_text, 'The weather in Oslo is rainy.');
});

test('responses: max_output_tokens reached is incomplete', { skip: needsScript }, async () => {
  const res = await client.responses.create({ model, input: '[[long]]', max_output_tokens: 4 });
  assert.equal(res.status, 'incomplete');
  assert.equal(res.incomplete_details.reason, 'max_output_tokens');
});

test('responses: failure after start ends with response.failed', { skip: needsScript }, async () => {
  const stream = await client.responses.create({ model, input: '[[fail]]', stream: true });
  const types = [];
  for await (const ev of stream) types.push(ev.type);
  assert.equal(types.at(-1), 'response.failed');
});

test('responses: previous_response_id is refused clearly', async () => {
  await assert.rejects(
    client.responses.create({ model, input: 'x', previous_response_id: 'resp_123' }),
    (err) => err instanceof OpenAI.BadRequestError && err.error?.param === 'previous_response_id' && /not supported/.test(err.message),
  );
});

test('tokenize and detokenize round-trip', async () => {
  const post = async (path, body) => {
    const res = await fetch(`${baseURL}${path}`, {
      method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` }, body: JSON.stringify(body),
    });
    assert.equal(res.status, 200);
    return res.json();
  };
  const { tokens } = await post('/tokenize', { model, content: 'hello world', add_special: false });
  assert.ok(Array.isArray(tokens) && tokens.length > 0 && tokens.every(Number.isInteger));
  const { content } = await post('/detokenize', { model, tokens });
  assert.equal(content, 'hello world');
});

test('a wrong API key is a 401 in each API shape', { skip: process.env.DFLASH_API_KEY ? false : 'needs DFLASH_API_KEY (a server with keys)' }, async () => {
  const bad = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(
    bad.chat.completions.create({ model, messages: user('x') }),
    (err) => err instanceof OpenAI.AuthenticationError && err.type === 'authentication_error',
  );
  const res = await fetch(`${baseURL}/v1/messages`, {
    method: 'POST', headers: { 'x-api-key': 'wrong-key', 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model, max_tokens: 5, messages: user('x') }),
  });
  assert.equal(res.status, 401);
  const body = await res.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'authentication_error');
  const health = await fetch(`${baseURL}/health`);
  assert.equal(health.status, 200, 'probes need no key');
});

test('completions: text prompt, non-streaming', async () => {
  const res = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: maxTokens, logprobs: 2 });
  assert.equal(res.object, 'text_completion');
  assert.match(res.id, /^cmpl-/);
  assert.equal(res.choices.length, 1);
  const choice = res.choices[0];
  assert.equal(typeof choice.text, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  const lp = choice.logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.length, lp.top_logprobs.length);
  assert.equal(lp.tokens.length, lp.text_offset.length);
  assert.ok(res.usage.prompt_tokens > 0);
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  if (scripted) assert.equal(choice.text, 'Hello from dflash! 😀 You said: Once upon a time');
});

test('completions: echo and token-id prompts', async () => {
  const res = await client.completions.create({ model, prompt: 'Echo me', max_tokens: maxTokens, echo: true });
  assert.ok(res.choices[0].text.startsWith('Echo me'));
  const { tokens } = await fetch(`${baseURL}/tokenize`, {
    method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, content: 'Echo me' }),
  }).then((r) => r.json());
  const byIds = await client.completions.create({ model, prompt: tokens, max_tokens: maxTokens, echo: true });
  assert.ok(byIds.choices[0].text.startsWith('Echo me'));
});

test('completions: streaming with include_usage', async () => {
  const stream = await client.completions.create({
    model, prompt: 'Count to three:', max_tokens: maxTokens, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason != null);
  assert.equal(finishes.length, 1, 'exactly one finish_reason');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.ok(last.usage.completion_tokens > 0);
  const text = chunks.flatMap((c) => c.choices).map((c) => c.text).join('');
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Count to three:');
});

test('completions: several prompts and n > 1 are 400s naming the parameter', async () => {
  for (const [body, param] of [[{ prompt: ['a', 'b'] }, 'prompt'], [{ prompt: 'a', n: 2 }, 'n']]) {
    await assert.rejects(client.completions.create({ model, max_tokens: 4, ...body }), (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.param, param);
      return true;
    });
  }
});

test('chat: tool_choice required and named force a call', async () => {
  const tools = [{ type: 'function', function: weatherTool }, { type: 'function', function: { name: 'get_time', parameters: { type: 'object' } } }];
  for (const [toolChoice, name] of [['required', null], [{ type: 'function', function: { name: 'get_time' } }, 'get_time']]) {
    const res = await client.chat.completions.create({ model, messages: user('Hello there.'), tools, tool_choice: toolChoice, max_tokens: 256 });
    const choice = res.choices[0];
    if (choice.finish_reason === 'length' && !scripted) continue; // a real model ran out of tokens mid-call
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length >= 1, true);
    const call = choice.message.tool_calls[0];
    if (name) assert.equal(call.function.name, name);
    else assert.ok(['get_weather', 'get_time'].includes(call.function.name));
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');
  }
});

test('chat: response_format json_schema gives JSON of the schema', async () => {
  const res = await client.chat.completions.create({
    model, messages: user('Answer yes or no, in JSON.'), max_tokens: 256,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema: {
      type: 'object', properties: { answer: { enum: ['yes', 'no'] } }, required: ['answer'], additionalProperties: false,
    } } },
  });
  const choice = res.choices[0];
  if (choice.finish_reason === 'length' && !scripted) return;
  assert.ok(['yes', 'no'].includes(JSON.parse(choice.message.content).answer));
});

test('chat: a json_schema keyword that is not supported is a 400 naming it', { skip: scripted ? 'the scripted router does not compile schemas' : false }, async () => {
  await assert.rejects(client.chat.completions.create({
    model, messages: user('x'), max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', properties: { a: { type: 'string', pattern: 'x+' } } } } },
  }), (err) => {
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.match(err.message, /"pattern" is not supported/);
    return true;
  });
});
