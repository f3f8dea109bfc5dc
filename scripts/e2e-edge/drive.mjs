// Drives headless Chromium through the DevTools protocol for scripts/e2e-edge.sh: opens PAGE_URL
// in a new tab, waits for `runStreams`, runs it and prints its result as JSON on stdout.
//
//   node --experimental-websocket drive.mjs DEVTOOLS_PORT PAGE_URL STREAMS MAX_TOKENS
//
// Talks only to 127.0.0.1 (the DevTools port and the page's origin); gives up after 120 s.

const [port, pageUrl, streams, maxTokens] = process.argv.slice(2);
if (!port || !pageUrl) {
  console.error("usage: drive.mjs DEVTOOLS_PORT PAGE_URL STREAMS MAX_TOKENS");
  process.exit(2);
}
if (typeof WebSocket !== "function") {
  console.error("this node has no WebSocket: run it with --experimental-websocket (node 20) or use node 22+");
  process.exit(2);
}
setTimeout(() => {
  console.error("drive.mjs: gave up after 120 s");
  process.exit(1);
}, 120_000).unref();

const devtools = `http://127.0.0.1:${port}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitForBrowser() {
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`${devtools}/json/version`);
      if (r.ok) return await r.json();
    } catch (e) {
      /* not up yet */
    }
    await sleep(100);
  }
  throw new Error(`no DevTools endpoint at ${devtools}`);
}

await waitForBrowser();
const target = await (await fetch(`${devtools}/json/new?about:blank`, { method: "PUT" })).json();
const ws = new WebSocket(target.webSocketDebuggerUrl);
await new Promise((resolve, reject) => {
  ws.onopen = resolve;
  ws.onerror = () => reject(new Error("cannot open the DevTools websocket"));
});
let nextId = 1;
const pending = new Map();
ws.onmessage = (message) => {
  const m = JSON.parse(message.data);
  if (m.id && pending.has(m.id)) {
    pending.get(m.id)(m);
    pending.delete(m.id);
  }
};
function send(method, params = {}) {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params }));
  return new Promise((resolve, reject) =>
    pending.set(id, (m) => (m.error ? reject(new Error(`${method}: ${m.error.message}`)) : resolve(m.result)))
  );
}
async function evaluate(expression) {
  const r = await send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
  if (r.exceptionDetails) throw new Error(`${expression}: ${JSON.stringify(r.exceptionDetails)}`);
  return r.result.value;
}

await send("Page.enable");
await send("Runtime.enable");
await send("Page.navigate", { url: pageUrl });
for (let i = 0; ; i++) {
  const ready = await evaluate("document.readyState === 'complete' && typeof runStreams === 'function'").catch(() => false);
  if (ready) break;
  if (i > 100) throw new Error(`the page at ${pageUrl} did not load runStreams`);
  await sleep(100);
}
const results = await evaluate(`runStreams(${Number(streams) || 4}, ${Number(maxTokens) || 40})`);
// sendBeacon queues the request; give it a moment before the browser is closed.
await sleep(500);
console.log(JSON.stringify(results));
ws.close();
process.exit(0);
