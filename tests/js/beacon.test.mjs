// Tests of assets/metronome-beacon.js under Node's test runner (`node --test tests/js/`), with a
// streaming server on 127.0.0.1. Node has fetch, ReadableStream and Response as a browser does;
// it has no navigator.sendBeacon, so the keepalive-fetch path runs unless a test provides one.
// Counts are asserted exactly, times with generous margins.

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const metronome = require("../../assets/metronome-beacon.js");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function chunk(delta) {
  return `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":${delta},"finish_reason":null}]}\n\n`;
}

test("token events are the ones that carry output", () => {
  const t = metronome.isTokenEvent;
  assert.equal(t('{"choices":[{"delta":{"content":"hi"}}]}'), true);
  assert.equal(t('{"choices":[{"delta":{"role":"assistant","content":""}}]}'), false);
  assert.equal(t('{"choices":[{"delta":{}, "finish_reason":"stop"}]}'), false);
  assert.equal(t('{"choices":[],"usage":{"completion_tokens":3}}'), false);
  assert.equal(t('{"choices":[{"text":" x"}]}'), true);
  assert.equal(t('{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"a"}}]}}]}'), true);
  assert.equal(t('{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}'), true);
  assert.equal(t('{"type":"ping"}'), false);
  assert.equal(t('{"token":{"text":" x","special":false}}'), true);
  assert.equal(t('{"token":{"text":"</s>","special":true}}'), false);
  assert.equal(t('{"message":{"role":"assistant","content":"x"},"done":false}'), true);
  assert.equal(t('{"response":"","done":true}'), false);
  assert.equal(t("[DONE]"), false);
  assert.equal(t("not json"), false);
});

test("the SSE parser follows the WHATWG line rules across chunks", () => {
  const events = [];
  const p = new metronome.SseParser((d) => events.push(d));
  p.feed("\ufeffdata: a\r");
  p.feed("\ndata: b\r\n\r\n: comment\n\ndata:c\rdata:  d\r\r");
  p.feed("event: x\nid: 1\ndata: {\"k\":");
  p.feed("1}\n");
  assert.deepEqual(events, ["a\nb", "c\n d"]);
  p.feed("\n");
  assert.deepEqual(events, ["a\nb", "c\n d", '{"k":1}']);
  p.feed("data: unfinished");
  p.end();
  assert.equal(events.length, 3);
});

test("the NDJSON parser takes one event per line", () => {
  const events = [];
  const p = new metronome.NdjsonParser((d) => events.push(d));
  p.feed('{"a":1}\r\n{"b"');
  p.feed(':2}\n\n{"c":3}');
  p.end();
  assert.deepEqual(events, ['{"a":1}', '{"b":2}', '{"c":3}']);
});

test("events of one chunk share its arrival; gaps are capped and the body stays small", () => {
  const m = new metronome.Meter("text/event-stream", 100, metronome.defaults);
  m.chunk(chunk('{"role":"assistant","content":""}'), 150);
  m.chunk(chunk('{"content":"a"}'), 400.04);
  m.chunk(chunk('{"content":"b"}') + chunk('{"content":"c"}'), 430.2);
  m.chunk(new TextEncoder().encode(chunk('{"content":"d"}').slice(0, 20)), 440);
  m.chunk(chunk('{"content":"d"}').slice(20) + "data: [DONE]\n\n", 500);
  m.end(501);
  assert.equal(m.tokenEvents, 4);
  assert.equal(m.events, 6);
  assert.deepEqual(m.summary("abc"), { v: 1, id: "abc", ttft_ms: 300, gaps_ms: [30.2, 0, 69.8] });

  const many = new metronome.Meter("text/event-stream", 0, metronome.defaults);
  for (let i = 0; i < 5000; i++) many.chunk(chunk('{"content":"x"}'), i * 1234.5678);
  const s = many.summary("id");
  assert.equal(s.gaps_ms.length <= 2048, true);
  assert.equal(JSON.stringify(s).length <= 16000, true);

  const none = new metronome.Meter("text/event-stream", 0, metronome.defaults);
  none.chunk("data: [DONE]\n\n", 1);
  assert.equal(none.summary("id"), null);
});

/**
 * A server on 127.0.0.1:0. POST /stream streams `script` (a list of [delay ms, text]) with the
 * stream ID header (unless `withId` is false) and a beacon key (unless `withKey` is false); POST /.well-known/metronome/beacon records bodies.
 */
async function server({ script, withId = true, withKey = true }) {
  const beacons = [];
  const closed = [];
  const srv = http.createServer({ noDelay: true }, async (req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    await new Promise((r) => req.on("end", r));
    if (req.url === "/.well-known/metronome/beacon") {
      beacons.push({ body, type: req.headers["content-type"] });
      res.writeHead(204).end();
      return;
    }
    const headers = { "content-type": "text/event-stream", "cache-control": "no-cache" };
    if (withId) headers["x-metronome-stream-id"] = "5f3a9c1e0d2b47a6b1c8e39f00a1d742";
    if (withId && withKey) headers["x-metronome-beacon-key"] = "0123456789abcdef0123456789abcdef";
    res.writeHead(200, headers);
    res.flushHeaders();
    let gone = false;
    res.on("close", () => {
      gone = !res.writableFinished;
      closed.push(gone);
    });
    for (const [delay, text] of script) {
      await sleep(delay);
      if (gone) return;
      res.write(text);
    }
    res.end();
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${srv.address().port}`;
  const close = () => new Promise((r) => (srv.close(r), srv.closeAllConnections()));
  return { url, beacons, closed, close };
}

async function waitFor(cond, ms = 2000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("timed out waiting");
    await sleep(10);
  }
}

const SCRIPT = [
  [30, chunk('{"role":"assistant","content":""}')],
  [50, chunk('{"content":"a"}')],
  [60, chunk('{"content":"b"}')],
  [60, chunk('{"content":"c"}') + chunk('{"content":"d"}')],
  [60, chunk('{"content":"e"}')],
  [10, 'data: {"choices":[],"usage":{"completion_tokens":5}}\n\ndata: [DONE]\n\n'],
];

test("metronomeFetch passes the body through and sends one beacon", async () => {
  const s = await server({ script: SCRIPT });
  try {
    const summaries = [];
    const response = await metronome.fetch(`${s.url}/stream`, { method: "POST", body: "{}" }, {
      onSummary: (x) => summaries.push(x),
    });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-metronome-stream-id"), "5f3a9c1e0d2b47a6b1c8e39f00a1d742");
    assert.equal(response.url, `${s.url}/stream`);
    const text = await response.text();
    assert.equal(text, SCRIPT.map(([, t]) => t).join(""));
    await waitFor(() => s.beacons.length === 1);
    assert.equal(s.beacons[0].type, "text/plain;charset=UTF-8");
    const beacon = JSON.parse(s.beacons[0].body);
    assert.deepEqual(beacon, summaries[0]);
    assert.equal(beacon.v, 1);
    assert.equal(beacon.id, "5f3a9c1e0d2b47a6b1c8e39f00a1d742");
    assert.equal(beacon.key, "0123456789abcdef0123456789abcdef");
    assert.equal(beacon.gaps_ms.length, 4);
    assert.equal(beacon.gaps_ms[2], 0, `c and d arrived in one chunk: ${beacon.gaps_ms}`);
    for (const i of [0, 1, 3]) {
      assert.ok(beacon.gaps_ms[i] > 40 && beacon.gaps_ms[i] < 200, `gap ${i}: ${beacon.gaps_ms}`);
    }
    assert.ok(beacon.ttft_ms > 70 && beacon.ttft_ms < 500, `ttft ${beacon.ttft_ms}`);
    await sleep(50);
    assert.equal(s.beacons.length, 1, "one beacon per stream");
  } finally {
    await s.close();
  }
});

test("navigator.sendBeacon is used when the browser has it", async () => {
  const s = await server({ script: SCRIPT.slice(0, 3) });
  const sent = [];
  globalThis.navigator = { sendBeacon: (url, body) => (sent.push({ url, body }), true) };
  try {
    const response = await metronome.fetch(`${s.url}/stream`, { method: "POST", body: "{}" });
    await response.text();
    await waitFor(() => sent.length === 1);
    assert.equal(sent[0].url, `${s.url}/.well-known/metronome/beacon`);
    assert.equal(JSON.parse(sent[0].body).gaps_ms.length, 1);
    assert.equal(s.beacons.length, 0);
  } finally {
    delete globalThis.navigator;
    await s.close();
  }
});

test("a response without the stream ID is handed back untouched and nothing is sent", async () => {
  const s = await server({ script: SCRIPT, withId: false });
  try {
    const response = await metronome.fetch(`${s.url}/stream`, { method: "POST", body: "{}" });
    assert.equal(await response.text(), SCRIPT.map(([, t]) => t).join(""));
    await sleep(100);
    assert.equal(s.beacons.length, 0);
  } finally {
    await s.close();
  }
});

test("a response without the beacon key is measured but sends nothing", async () => {
  const s = await server({ script: SCRIPT, withKey: false });
  try {
    const summaries = [];
    const response = await metronome.fetch(`${s.url}/stream`, { method: "POST", body: "{}" }, {
      onSummary: (x) => summaries.push(x),
    });
    assert.equal(await response.text(), SCRIPT.map(([, t]) => t).join(""));
    await sleep(100);
    assert.equal(summaries.length, 1);
    assert.equal(summaries[0].key, undefined);
    assert.equal(s.beacons.length, 0);
  } finally {
    await s.close();
  }
});

test("cancelling the page's body cancels the download and still reports what arrived", async () => {
  const long = [...SCRIPT.slice(0, 3), ...Array.from({ length: 50 }, () => [50, chunk('{"content":"x"}')])];
  const s = await server({ script: long });
  try {
    const response = await metronome.fetch(`${s.url}/stream`, { method: "POST", body: "{}" });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let seen = "";
    while (!seen.includes('"b"')) seen += decoder.decode((await reader.read()).value);
    const cancelled = Date.now();
    await reader.cancel();
    await waitFor(() => s.closed.length === 1);
    assert.ok(Date.now() - cancelled < 1000, "the cancel reached the server at once");
    assert.equal(s.closed[0], true, "the server saw the client go away before the end");
    await waitFor(() => s.beacons.length === 1);
    assert.equal(JSON.parse(s.beacons[0].body).gaps_ms.length, 1);
  } finally {
    await s.close();
  }
});
