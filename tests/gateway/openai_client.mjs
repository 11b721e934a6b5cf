// The official OpenAI client against the gateway on the demo model: completions and chat,
// streaming and not, for the base model and each adapter; every answer must be the demo's rule
// answer (examples/demo/README.md); a too-long prompt and unimplemented fields are 400s. Usage: node openai_client.mjs BASE_URL
// The package comes from tools/install-test-deps.sh's cache (LS_OPENAI_CACHE).
import { createRequire } from 'node:module';
import path from 'node:path';
import os from 'node:os';

const cache = process.env.LS_OPENAI_CACHE || path.join(os.homedir(), '.cache/loraserve/openai');
const require = createRequire(path.join(cache, 'node_modules/'));
let OpenAI;
try {
  OpenAI = require('openai').default ?? require('openai');
} catch (e) {
  console.error(`the openai package is not in ${cache}: run tools/install-test-deps.sh (${e.message})`);
  process.exit(2);
}

const client = new OpenAI({ baseURL: process.argv[2], apiKey: process.env.LS_API_KEY || 'none', maxRetries: 0 });
const prompt = 'input: 5 leaf road 1 red\noutput:';
const want = {
  demo: ' 5 leaf road 1 red',
  reverse: ' red 1 road leaf 5',
  upper: ' 5 LEAF ROAD 1 RED',
  sort: ' 1 5 leaf red road',
  digits: ' five leaf road one red',
};
let failed = 0, passed = 0;
function check(what, got, expected) {
  if (got === expected) { passed++; return; }
  failed++;
  console.error(`FAIL ${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(expected)}`);
}

const models = await client.models.list();
const ids = models.data.map((m) => m.id);
for (const m of Object.keys(want)) check(`models list has ${m}`, ids.includes(m), true);

for (const [model, expected] of Object.entries(want)) {
  const common = { model, temperature: 0, max_tokens: 24 };
  const c = await client.completions.create({ ...common, prompt });
  check(`${model} completion`, c.choices[0].text, expected);
  check(`${model} completion finish`, c.choices[0].finish_reason, 'stop');
  check(`${model} completion usage`, c.usage.completion_tokens > 0 && c.usage.prompt_tokens > 0, true);

  let text = '';
  for await (const chunk of await client.completions.create({ ...common, prompt, stream: true })) text += chunk.choices[0]?.text ?? '';
  check(`${model} streamed completion`, text, expected);

  const messages = [{ role: 'user', content: prompt }];
  const chat = await client.chat.completions.create({ ...common, messages });
  check(`${model} chat`, chat.choices[0].message.content, expected);
  check(`${model} chat role`, chat.choices[0].message.role, 'assistant');

  text = '';
  for await (const chunk of await client.chat.completions.create({ ...common, messages, stream: true })) text += chunk.choices[0]?.delta?.content ?? '';
  check(`${model} streamed chat`, text, expected);
}
// Logprobs name tokens by their text, as OpenAI and vLLM do: the tokens, concatenated, are the
// generated text (ASCII on the demo model), and the alternatives are texts too, never ids.
const isText = (t) => typeof t === 'string' && !t.startsWith('token_id:');
for (const model of ['demo', 'reverse']) {
  const expected = want[model];
  const common = { model, temperature: 0, max_tokens: 24 };
  const c = await client.completions.create({ ...common, prompt, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  check(`${model} logprobs tokens`, lp.tokens.join(''), expected);
  check(`${model} logprobs top keys`, lp.top_logprobs.every((o) => Object.keys(o).length >= 1 && Object.keys(o).every(isText)), true);
  let text = '', toks = '';
  for await (const chunk of await client.completions.create({ ...common, prompt, logprobs: 2, stream: true })) {
    text += chunk.choices[0]?.text ?? '';
    toks += (chunk.choices[0]?.logprobs?.tokens ?? []).join('');
  }
  check(`${model} streamed logprobs tokens`, toks, text);
  check(`${model} streamed logprobs text`, text, expected);

  const messages = [{ role: 'user', content: prompt }];
  const chat = await client.chat.completions.create({ ...common, messages, logprobs: true, top_logprobs: 2 });
  const content = chat.choices[0].logprobs.content;
  check(`${model} chat logprobs tokens`, content.map((e) => e.token).join(''), expected);
  check(`${model} chat logprobs bytes`, content.every((e) => Buffer.from(e.bytes).toString('utf8') === e.token), true);
  check(`${model} chat top_logprobs`, content.every((e) => e.top_logprobs.length === 2 && e.top_logprobs.every((t) => isText(t.token))), true);
  toks = '';
  for await (const chunk of await client.chat.completions.create({ ...common, messages, logprobs: true, top_logprobs: 1, stream: true }))
    toks += (chunk.choices[0]?.logprobs?.content ?? []).map((e) => e.token).join('');
  check(`${model} streamed chat logprobs tokens`, toks, expected);
}
// "base:adapter" names an adapter too.
const c = await client.completions.create({ model: 'demo:upper', prompt, temperature: 0, max_tokens: 24 });
check('demo:upper completion', c.choices[0].text, want.upper);
// An unknown model is the client's NotFoundError.
try {
  await client.completions.create({ model: 'no-such-adapter', prompt, max_tokens: 4 });
  check('unknown model', 'answered', '404');
} catch (e) {
  check('unknown model status', e.status, 404);
}
// A prompt beyond the context (256 tokens) is the client's BadRequestError, code
// context_length_exceeded, as OpenAI and vLLM answer it; so is a long chat.
const long = 'input:' + ' cup'.repeat(300);
for (const [what, call] of [
  ['completion', () => client.completions.create({ model: 'demo', prompt: long, max_tokens: 4 })],
  ['chat', () => client.chat.completions.create({ model: 'reverse', messages: [{ role: 'user', content: long }] })],
  ['streamed completion', () => client.completions.create({ model: 'demo', prompt: long, max_tokens: 4, stream: true })],
]) {
  try {
    await call();
    check(`too long ${what}`, 'answered', '400');
  } catch (e) {
    check(`too long ${what} status`, e.status, 400);
    check(`too long ${what} code`, e.code, 'context_length_exceeded');
    check(`too long ${what} message`, /maximum context length is 256 tokens/.test(e.message), true);
  }
}
// Fields the server does not implement are refused by name, never ignored.
for (const [field, extra] of [
  ['response_format', { response_format: { type: 'grammar' } }],  // json_object and json_schema are served
  ['logit_bias', { logit_bias: { 50: -100 } }],
  ['tool_choice', { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }], tool_choice: 'auto' }],
]) {
  try {
    await client.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: prompt }], ...extra });
    check(`${field} refused`, 'answered', '400');
  } catch (e) {
    check(`${field} status`, e.status, 400);
    check(`${field} param`, e.param, field);
  }
}
// Harmless fields are served: user, and a response_format of plain text.
const plain = await client.chat.completions.create({
  model: 'upper', messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 24,
  user: 'e2e', response_format: { type: 'text' },
});
check('user and text response_format', plain.choices[0].message.content, want.upper);
// Tools and chat_template_kwargs reach the chat template (the demo's ChatML template prints no
// tools, so the answer is the same).
const withTools = await client.chat.completions.create({
  model: 'upper', messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 24,
  tools: [{ type: 'function', function: { name: 'f', parameters: {} } }], chat_template_kwargs: { enable_thinking: false },
});
check('tools served', withTools.choices[0].message.content, want.upper);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
