// The AI SDK (ai) with its OpenAI-compatible provider against dflash_server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, tool, stepCountIs, APICallError } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';
import { baseURL, scripted, model, apiKey, maxTokens, needsScript } from './env.mjs';

const provider = createOpenAICompatible({ name: 'dflash', baseURL: `${baseURL}/v1`, apiKey, includeUsage: true });
const lm = provider.chatModel(model);

test('ai-sdk: generateText', async () => {
  const res = await generateText({ model: lm, prompt: 'Say hello.', maxOutputTokens: maxTokens, maxRetries: 0 });
  assert.ok(['stop', 'length'].includes(res.finishReason));
  assert.ok(res.usage.inputTokens > 0);
  if (scripted) assert.equal(res.text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('ai-sdk: streamText with usage', async () => {
  const res = streamText({ model: lm, prompt: 'Say hello.', maxOutputTokens: maxTokens, maxRetries: 0 });
  let text = '';
  for await (const t of res.textStream) text += t;
  const usage = await res.usage;
  assert.ok(usage.outputTokens > 0);
  assert.equal(text, await res.text);
  if (scripted) assert.equal(text, 'Hello from dflash! 😀 You said: Say hello.');
});

test('ai-sdk: reasoning_content becomes reasoning', { skip: needsScript }, async () => {
  const res = await generateText({ model: lm, prompt: '2+2? [[reason]]', maxOutputTokens: maxTokens, maxRetries: 0 });
  assert.equal(res.reasoningText, 'Two plus two; that is four.');
  assert.equal(res.text, '2 + 2 = 4');
});

test('ai-sdk: tool call round trip', { skip: needsScript }, async () => {
  const calls = [];
  const res = await generateText({
    model: lm,
    prompt: 'Weather in Oslo? [[tool]]',
    maxOutputTokens: maxTokens,
    maxRetries: 0,
    stopWhen: stepCountIs(3),
    tools: {
      get_weather: tool({
        description: 'Current weather of a city',
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => { calls.push(city); return 'sunny'; },
      }),
    },
  });
  assert.deepEqual(calls, ['Oslo']);
  assert.equal(res.steps.length, 2);
  assert.equal(res.steps[0].finishReason, 'tool-calls');
  assert.match(res.text, /The weather in Oslo is .*sunny/);
});

test('ai-sdk: 503 surfaces as APICallError', { skip: needsScript }, async () => {
  await assert.rejects(
    generateText({ model: lm, prompt: '[[503]]', maxRetries: 0 }),
    (err) => APICallError.isInstance(err) && err.statusCode === 503 && err.isRetryable === true,
  );
});
