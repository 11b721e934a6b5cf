// The playground page in a real headless Chromium, driven over the DevTools protocol on
// Chromium's --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-terminated JSON): no npm package.
// Usage: node playground.mjs URL API_KEY ADAPTER_DIR WANT_REVERSE WANT_UPPER
//   URL: the gateway; ADAPTER_DIR: the demo's upper adapter (loaded as "up2"); WANT_*: the
//   answers the API gives directly for the demo prompt with reverse and with upper.
// Exits 0 when every step passed, else 1 with the step that failed and the page's state.
// CHROMIUM names the browser (default: chromium on PATH).
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, key, adapterDir, wantReverse, wantUpper] = process.argv.slice(2);
if (!wantUpper) {
  console.error("usage: node playground.mjs URL API_KEY ADAPTER_DIR WANT_REVERSE WANT_UPPER");
  process.exit(2);
}
const PROMPT = "input: 5 leaf road 1 red\noutput:";
const EVIL = '<img src=x onerror="window.pwned=1">';  // an adapter name that must stay text
const LIMIT_MS = 50000;

const profile = mkdtempSync(join(tmpdir(), "ls-chromium-"));
// --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
const browser = spawn(process.env.CHROMIUM || "chromium",
  ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
   "--disable-extensions", "--disable-background-networking", "--remote-debugging-pipe",
   `--user-data-dir=${profile}`, "about:blank"],
  // detached: its own process group, so that the renderers and helpers go with it at the end.
  { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], detached: true });
let browserErr = "";
browser.stderr.on("data", (d) => { browserErr = (browserErr + d).slice(-4000); });

let finished = false;
// The browser's whole group killed; its profile removed once it is gone (it writes there until then).
function finish(code, why) {
  if (finished) return;
  finished = true;
  if (why) console.error(why);
  const done = () => {
    try { rmSync(profile, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 }); }
    catch (e) { console.error(`note: ${profile} is left behind: ${e.message}`); }
    process.exit(code);
  };
  if (browser.exitCode !== null || browser.signalCode !== null || !browser.pid) return done();
  browser.once("exit", done);
  try { process.kill(-browser.pid, "SIGKILL"); } catch (e) { browser.kill("SIGKILL"); }
  setTimeout(done, 3000);
}
browser.on("error", (e) => finish(1, `FAIL: cannot start Chromium (${e.message}): tools/install-test-deps.sh installs it`));
browser.on("exit", (code) => finish(1, `FAIL: Chromium exited (${code}) before the test ended:\n${browserErr}`));
setTimeout(() => fail(`the test took more than ${LIMIT_MS / 1000} s`), LIMIT_MS).unref();

// ---- the protocol ----------------------------------------------------------------------------
let nextId = 1, inbuf = "";
const pending = new Map(), problems = [];
browser.stdio[4].on("data", (chunk) => {
  inbuf += chunk.toString("utf8");
  let end;
  while ((end = inbuf.indexOf("\0")) >= 0) {
    const msg = JSON.parse(inbuf.slice(0, end));
    inbuf = inbuf.slice(end + 1);
    if (msg.id && pending.has(msg.id)) {
      const { resolve, reject, method } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) reject(new Error(`${method}: ${msg.error.message}`)); else resolve(msg.result);
    } else if (msg.method === "Runtime.exceptionThrown") {
      const d = msg.params.exceptionDetails;
      problems.push(`uncaught exception: ${d.exception ? d.exception.description : d.text}`);
    } else if (msg.method === "Log.entryAdded") {
      // CSP violations come as source "security"; script errors as "javascript". A fetch
      // answered 401 is a "network" entry, which the page is meant to survive.
      const e = msg.params.entry;
      if (e.level === "error" && e.source !== "network") problems.push(`${e.source}: ${e.text}`);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  browser.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject, method }));
}

let session;
const page = (method, params) => send(method, params, session);
async function evaluate(expression) {
  const r = await page("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
  if (r.exceptionDetails) throw new Error(`evaluating ${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
  return r.result.value;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function waitFor(expression, what, ms = 15000) {
  const until = Date.now() + ms;
  for (;;) {
    const v = await evaluate(expression);
    if (v) return v;
    if (Date.now() > until) throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`);
    await sleep(100);
  }
}
// Typing as a user does: focus, then the text as the keyboard would insert it.
async function type(id, text) {
  await evaluate(`(() => { const e = document.getElementById(${JSON.stringify(id)}); e.value = ""; e.focus(); })()`);
  await page("Input.insertText", { text });
  const got = await evaluate(`document.getElementById(${JSON.stringify(id)}).value`);
  if (got !== text) throw new Error(`typed ${JSON.stringify(text)} into #${id}, it holds ${JSON.stringify(got)}`);
}
const click = (selector) => evaluate(`document.querySelector(${JSON.stringify(selector)}).click()`);
const text = (id) => evaluate(`document.getElementById(${JSON.stringify(id)}).textContent`);
async function fail(why) {
  let state = "";
  try {
    state = await evaluate(`JSON.stringify({status: document.getElementById("status").textContent,
      admin: document.getElementById("admin-status").textContent,
      transcript: [...document.querySelectorAll(".msg")].map((m) => m.dataset.role + "/" + (m.dataset.state || "") + ": " + m.querySelector(".text").textContent),
      models: [...document.getElementById("model").options].map((o) => o.value),
      tokens: document.getElementById("m-tokens").textContent})`);
  } catch (e) { state = `(page state unreadable: ${e.message})`; }
  finish(1, `FAIL: ${why}\npage state: ${state}${problems.length ? "\npage errors: " + problems.join("; ") : ""}`);
}

// One chat turn through the page: model picked, prompt typed, Send clicked; the answer once its
// stream ended, with the number of times its text changed (more than one: it streamed).
async function chat(model, prompt) {
  await evaluate(`(() => { const s = document.getElementById("model"); s.value = ${JSON.stringify(model)};
                          s.dispatchEvent(new Event("change")); return s.value; })()`);
  if (await evaluate(`document.getElementById("model").value`) !== model) throw new Error(`cannot pick model ${model}`);
  await click("#clear");
  await type("prompt", prompt);
  await evaluate(`window.updates = 0; new MutationObserver((rs) => { window.updates += rs.length; })
                  .observe(document.getElementById("transcript"), {childList: true, subtree: true, characterData: true})`);
  await click("#send");
  const state = await waitFor(`(() => { const m = document.querySelector('.msg[data-role="assistant"]');
                                        return m && m.dataset.state !== "streaming" && m.dataset.state; })()`,
                              `the ${model} answer to end`);
  const answer = await evaluate(`document.querySelector('.msg[data-role="assistant"] .text').textContent`);
  if (state !== "done") throw new Error(`the ${model} chat ended ${state}: ${answer}`);
  return { answer, updates: await evaluate("window.updates") };
}

// ---- the test --------------------------------------------------------------------------------
async function main() {
  const { targetId } = await send("Target.createTarget", { url: "about:blank" });
  ({ sessionId: session } = await send("Target.attachToTarget", { targetId, flatten: true }));
  await page("Runtime.enable");
  await page("Log.enable");
  await page("Page.enable");
  await page("Page.navigate", { url: url + "/" });
  await waitFor(`document.readyState === "complete" && !!document.getElementById("send")`, "the page to load");
  console.log("page loaded");

  // Without the key the server refuses the page's calls, and the page says so.
  await waitFor(`document.getElementById("status").textContent.includes("API key")`, "the page to ask for the API key");
  await type("key", key);
  await click("#key-save");
  if (await evaluate(`sessionStorage.getItem("loraserve.apiKey")`) !== key) throw new Error("the key is not in sessionStorage");
  await waitFor(`["reverse", "upper", "sort", "digits"].every((n) => document.querySelector('#adapters tr[data-name="' + n + '"]'))
                 && [...document.getElementById("model").options].some((o) => o.value === "reverse")`,
                "the demo adapters in the table and the model picker");
  console.log("key accepted: adapters listed");
  await waitFor(`/^[0-9]+$/.test(document.getElementById("m-tokens").textContent)`, "the first metrics");
  const tokens0 = Number(await text("m-tokens"));

  // A chat streams the adapter's answer, equal to what the API gives directly.
  const rev = await chat("reverse", PROMPT);
  if (rev.answer !== wantReverse) throw new Error(`reverse answered ${JSON.stringify(rev.answer)} in the page, ${JSON.stringify(wantReverse)} by the API`);
  if (rev.updates < 3) throw new Error(`the answer did not stream: its text changed ${rev.updates} times`);
  console.log(`chat with reverse streamed ${JSON.stringify(rev.answer)} (${rev.updates} updates)`);

  // The metrics follow: the tokens generated grow past their value before the chat.
  await waitFor(`Number(document.getElementById("m-tokens").textContent) > ${tokens0}`, "the metrics to count the chat's tokens", 10000);
  await waitFor(`/^[0-9.]+$/.test(document.getElementById("m-tps").textContent) && /\\//.test(document.getElementById("m-slots").textContent)`,
                "tokens/s and the GPU slots");
  console.log(`metrics: tokens ${tokens0} -> ${await text("m-tokens")}, ${await text("m-tps")} tokens/s, slots ${await text("m-slots")}`);

  // Load an adapter through the page, chat with it, unload it.
  await type("lora-name", "up2");
  await type("lora-path", adapterDir);
  await click("#lora-load");
  await waitFor(`!!document.querySelector('#adapters tr[data-name="up2"]') && document.getElementById("admin-status").textContent.includes("added")`,
                "up2 loaded and listed", 20000);
  const up = await chat("up2", PROMPT);
  if (up.answer !== wantUpper) throw new Error(`up2 answered ${JSON.stringify(up.answer)}, upper ${JSON.stringify(wantUpper)} by the API`);
  console.log(`loaded up2; it answers ${JSON.stringify(up.answer)}`);
  await click('#adapters tr[data-name="up2"] button.unload');
  await waitFor(`!document.querySelector('#adapters tr[data-name="up2"]') && document.getElementById("admin-status").textContent.includes("removed")`,
                "up2 unloaded and gone from the table", 20000);
  console.log("unloaded up2");

  // A name that is HTML stays text: listed as written, nothing of it runs.
  await type("lora-name", EVIL);
  await click("#lora-load");
  await waitFor(`[...document.querySelectorAll("#adapters tr")].some((r) => r.firstChild.textContent === ${JSON.stringify(EVIL)})`,
                "the HTML-named adapter listed as text", 20000);
  if (await evaluate(`document.querySelectorAll("#adapters img, #model img").length || window.pwned ? 1 : 0`))
    throw new Error("an adapter name was rendered as HTML");
  await evaluate(`[...document.querySelectorAll("#adapters tr")].find((r) => r.firstChild.textContent === ${JSON.stringify(EVIL)})
                  .querySelector("button.unload").click()`);
  await waitFor(`![...document.querySelectorAll("#adapters tr")].some((r) => r.firstChild.textContent === ${JSON.stringify(EVIL)})`,
                "the HTML-named adapter unloaded", 20000);
  console.log("an HTML adapter name shown as text");

  if (problems.length) throw new Error("the page logged errors");
}

main().then(() => finish(0, null), (e) => fail(e.message));
