/*
 * metronome-beacon.js: the browser's side of metronome (docs/beacon.md tells how to use it).
 *
 * Measures the cadence of a streamed LLM response where the user sees it, in the page, and sends
 * one compact summary per stream back to metronome, which records it under point="client" next to
 * its own ingress and egress figures. That third curve is the only one that shows what an edge
 * between metronome and the user (a buffering load balancer, CDN or gateway) does to the stream.
 *
 * Dependency-free, no build step. Load it as a classic script or import it for its side effect;
 * either way it defines `metronomeFetch` and `metronome` on the global object (and exports them
 * under CommonJS):
 *
 *   <script src="/metronome-beacon.js"></script>
 *   const response = await metronomeFetch("/v1/chat/completions", {method: "POST", body});
 *   // read response.body exactly as with fetch()
 *
 * What it does, per call:
 *  - calls fetch(); when the response carries the stream ID header (x-metronome-stream-id) and a
 *    body, returns a Response whose body passes the very same chunks through, in order, while
 *    reading the network eagerly, so each chunk is stamped with performance.now() when it arrives,
 *    not when the page gets round to reading it (the page's own reading is not slowed or changed;
 *    cancelling the page's body cancels the download as with fetch());
 *  - parses the chunks as SSE (WHATWG rules: LF, CR or CRLF, BOM, comments, multi-line data) or,
 *    for application/x-ndjson, as one JSON document per line, and finds the token events: events
 *    that carry output (OpenAI choices[].delta.content / choices[].text / tool-call arguments,
 *    Anthropic content_block_delta, TGI token.text, Ollama message.content / response). Role-only
 *    and empty deltas, usage chunks, pings and [DONE] are not token events;
 *  - events completed by one chunk share its arrival time, so token events that arrive together
 *    have a gap of 0: the clump the reader sees;
 *  - when the body ends (or fails, or is cancelled) and at least one token event arrived, sends
 *    {"v":1,"id":…,"key":…,"ttft_ms":…,"gaps_ms":[…]} once (key: the response's
 *    x-metronome-beacon-key, which only this client received; metronome refuses a beacon without
 *    it, so a response without the key sends nothing), with navigator.sendBeacon when available and
 *    fetch(…, {keepalive: true}) otherwise, to the beacon path resolved against the stream's URL
 *    (same origin as the stream, so it reaches the same metronome). ttft_ms counts from the
 *    metronomeFetch call; gaps_ms are at most 2048 and the body stays under 16 KiB.
 *
 * Responses without the header (not metered by metronome, or the header is not exposed to the
 * page, see docs/beacon.md on same-origin) are handed back untouched and nothing is sent.
 */
(function (root) {
  "use strict";

  /** Settings a call may override (the third argument of metronomeFetch). */
  var DEFAULTS = {
    /** Where beacons go, resolved against the stream's URL. metronome's default. */
    beaconPath: "/.well-known/metronome/beacon",
    /** The response header that carries metronome's stream ID. */
    header: "x-metronome-stream-id",
    /** The response header that carries the stream's beacon key. */
    keyHeader: "x-metronome-beacon-key",
    /** Gaps per beacon; metronome refuses more. */
    maxGaps: 2048,
    /** Beacon body size; metronome's default cap is 16384 bytes. */
    maxBytes: 16000,
    /** Set to false to measure without sending (onSummary still gets the summary). */
    send: true,
    /** Called with the summary object when the stream ends (before it is sent). */
    onSummary: null,
    /** Called per event: onEvent(data, isTokenEvent, arrivalMs). */
    onEvent: null,
  };

  function now() {
    return root.performance && root.performance.now ? root.performance.now() : Date.now();
  }

  function nonEmpty(s) {
    return typeof s === "string" && s.length > 0;
  }

  /**
   * Whether one event's data carries output. The shapes of the common streaming APIs; anything
   * that does not parse as JSON (or is [DONE]) is not a token event.
   */
  function isTokenEvent(data) {
    if (!data || data === "[DONE]") return false;
    var v;
    try {
      v = JSON.parse(data);
    } catch (e) {
      return false;
    }
    if (!v || typeof v !== "object") return false;
    if (Array.isArray(v.choices)) {
      for (var i = 0; i < v.choices.length; i++) {
        var c = v.choices[i] || {};
        if (nonEmpty(c.text)) return true;
        var d = c.delta;
        if (d && (nonEmpty(d.content) || nonEmpty(d.reasoning_content))) return true;
        if (d && Array.isArray(d.tool_calls)) {
          for (var j = 0; j < d.tool_calls.length; j++) {
            var f = d.tool_calls[j] && d.tool_calls[j].function;
            if (f && nonEmpty(f.arguments)) return true;
          }
        }
      }
      return false;
    }
    if (v.type === "content_block_delta" && v.delta) {
      return nonEmpty(v.delta.text) || nonEmpty(v.delta.partial_json) || nonEmpty(v.delta.thinking);
    }
    if (v.token && typeof v.token === "object") return !v.token.special && nonEmpty(v.token.text);
    if (v.message && typeof v.message === "object") return nonEmpty(v.message.content);
    return nonEmpty(v.response);
  }

  /**
   * An incremental SSE parser: feed() text as it arrives, onEvent(data) is called for every event
   * dispatched (a blank line after at least one data field). Lines may end in LF, CR or CRLF, also
   * when a CRLF is split between two chunks.
   */
  function SseParser(onEvent) {
    this.onEvent = onEvent;
    this.line = "";
    this.data = null;
    this.skipLf = false;
    this.started = false;
  }
  SseParser.prototype.feed = function (text) {
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    var start = 0;
    for (var i = 0; i < text.length; i++) {
      var ch = text.charCodeAt(i);
      if (this.skipLf) {
        this.skipLf = false;
        if (ch === 10) {
          start = i + 1;
          continue;
        }
      }
      if (ch === 10 || ch === 13) {
        this.line += text.slice(start, i);
        this.endLine();
        this.skipLf = ch === 13;
        start = i + 1;
      }
    }
    this.line += text.slice(start);
  };
  SseParser.prototype.endLine = function () {
    var line = this.line;
    this.line = "";
    if (line === "") {
      if (this.data !== null) {
        var data = this.data;
        this.data = null;
        this.onEvent(data.charCodeAt(data.length - 1) === 10 ? data.slice(0, -1) : data);
      }
      return;
    }
    if (line.charCodeAt(0) === 58) return; // ":" comment
    var colon = line.indexOf(":");
    var field = colon < 0 ? line : line.slice(0, colon);
    var value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    if (field === "data") this.data = (this.data === null ? "" : this.data) + value + "\n";
  };
  /** The body ended: a trailing event without its blank line is not dispatched (WHATWG). */
  SseParser.prototype.end = function () {};

  /** NDJSON: one event per non-empty line. */
  function NdjsonParser(onEvent) {
    this.onEvent = onEvent;
    this.line = "";
  }
  NdjsonParser.prototype.feed = function (text) {
    var parts = (this.line + text).split("\n");
    this.line = parts.pop();
    for (var i = 0; i < parts.length; i++) {
      var l = parts[i].replace(/\r$/, "");
      if (l.trim() !== "") this.onEvent(l);
    }
  };
  NdjsonParser.prototype.end = function () {
    if (this.line.trim() !== "") this.onEvent(this.line);
    this.line = "";
  };

  /**
   * One stream's measurement: chunk arrivals in, TTFT and gaps out. `t0` is the performance.now()
   * of the fetch call.
   */
  function Meter(contentType, t0, options) {
    var self = this;
    this.t0 = t0;
    this.options = options || DEFAULTS;
    this.first = null;
    this.last = null;
    this.gaps = [];
    this.tokenEvents = 0;
    this.events = 0;
    this.at = t0;
    this.decoder = new TextDecoder("utf-8");
    var onEvent = function (data) {
      var token = isTokenEvent(data);
      self.events++;
      if (token) self.token(self.at);
      if (typeof self.options.onEvent === "function") {
        try {
          self.options.onEvent(data, token, self.at);
        } catch (e) {
          /* a page callback never breaks the measurement */
        }
      }
    };
    var ndjson = /^application\/(x-)?ndjson/i.test(contentType || "");
    this.parser = ndjson ? new NdjsonParser(onEvent) : new SseParser(onEvent);
  }
  /** A chunk (Uint8Array or string) arrived at `at` (performance.now()). */
  Meter.prototype.chunk = function (chunk, at) {
    this.at = at;
    var text = typeof chunk === "string" ? chunk : this.decoder.decode(chunk, { stream: true });
    this.parser.feed(text);
  };
  /** The body ended at `at`. */
  Meter.prototype.end = function (at) {
    this.at = at;
    this.parser.feed(this.decoder.decode());
    this.parser.end();
  };
  Meter.prototype.token = function (at) {
    this.tokenEvents++;
    if (this.first === null) {
      this.first = at;
    } else if (this.gaps.length < this.options.maxGaps) {
      this.gaps.push(at - this.last);
    }
    this.last = at;
  };
  /** The beacon body for stream `id`, or null without a token event. */
  Meter.prototype.summary = function (id) {
    if (this.first === null) return null;
    var round = function (ms) {
      return Math.max(0, Math.round(ms * 10) / 10);
    };
    var summary = { v: 1, id: id, ttft_ms: round(this.first - this.t0), gaps_ms: this.gaps.map(round) };
    // Stay under the size cap whatever the gaps look like: drop gaps from the end.
    while (JSON.stringify(summary).length > this.options.maxBytes && summary.gaps_ms.length > 0) {
      summary.gaps_ms.length = Math.floor(summary.gaps_ms.length * 0.9);
    }
    return summary;
  };

  function merge(defaults, options) {
    var out = {};
    for (var k in defaults) out[k] = defaults[k];
    if (options) for (var key in options) if (options[key] !== undefined) out[key] = options[key];
    return out;
  }

  /** Sends the beacon: sendBeacon when the browser has it, else a keepalive fetch. */
  function sendSummary(url, summary) {
    var body = JSON.stringify(summary);
    var nav = root.navigator;
    try {
      if (nav && typeof nav.sendBeacon === "function" && nav.sendBeacon(url, body)) return;
    } catch (e) {
      /* fall through to fetch */
    }
    try {
      var sent = root.fetch(url, {
        method: "POST",
        body: body,
        keepalive: true,
        credentials: "same-origin",
        headers: { "content-type": "text/plain;charset=UTF-8" },
      });
      if (sent && sent.catch) sent.catch(function () {});
    } catch (e) {
      /* a lost beacon is a lost measurement, never a page error */
    }
  }

  function requestUrl(input) {
    if (typeof input === "string") return input;
    if (input && typeof input.url === "string") return input.url;
    return String(input);
  }

  /**
   * fetch() with the stream measured: same arguments, same Response (status, headers, url), and a
   * body that yields the same chunks. The third argument overrides DEFAULTS.
   */
  function metronomeFetch(input, init, options) {
    var opts = merge(DEFAULTS, options);
    var t0 = now();
    return root.fetch(input, init).then(function (response) {
      var id = response.headers.get(opts.header);
      var key = response.headers.get(opts.keyHeader);
      if (!id || !response.body || typeof root.ReadableStream !== "function") return response;
      var base = response.url || requestUrl(input);
      var beaconUrl;
      try {
        beaconUrl = new URL(opts.beaconPath, base || (root.location && root.location.href)).href;
      } catch (e) {
        beaconUrl = opts.beaconPath;
      }
      var meter = new Meter(response.headers.get("content-type"), t0, opts);
      var reader = response.body.getReader();
      var finished = false;
      var finish = function () {
        if (finished) return;
        finished = true;
        meter.end(now());
        var summary = meter.summary(id);
        if (!summary) return;
        if (key) summary.key = key;
        if (typeof opts.onSummary === "function") {
          try {
            opts.onSummary(summary);
          } catch (e) {
            /* ignore */
          }
        }
        // Without its key a beacon would be refused (403): measure, but send nothing.
        if (opts.send && key) sendSummary(beaconUrl, summary);
      };
      var body = new root.ReadableStream({
        start: function (controller) {
          // Read eagerly, so every chunk is stamped when it arrives from the network.
          function pump() {
            return reader.read().then(
              function (step) {
                if (step.done) {
                  finish();
                  try {
                    controller.close();
                  } catch (e) {
                    /* already cancelled */
                  }
                  return;
                }
                meter.chunk(step.value, now());
                try {
                  controller.enqueue(step.value);
                } catch (e) {
                  /* the page cancelled; keep measuring until the cancel reaches the network */
                }
                return pump();
              },
              function (error) {
                finish();
                try {
                  controller.error(error);
                } catch (e) {
                  /* already cancelled */
                }
              }
            );
          }
          pump();
        },
        cancel: function (reason) {
          finish();
          return reader.cancel(reason);
        },
      });
      var wrapped = new root.Response(body, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      });
      ["url", "redirected", "type"].forEach(function (name) {
        try {
          Object.defineProperty(wrapped, name, { value: response[name] });
        } catch (e) {
          /* read-only in some engines: the wrapped body still works */
        }
      });
      return wrapped;
    });
  }

  var api = {
    version: 1,
    fetch: metronomeFetch,
    defaults: DEFAULTS,
    isTokenEvent: isTokenEvent,
    SseParser: SseParser,
    NdjsonParser: NdjsonParser,
    Meter: Meter,
  };
  root.metronome = api;
  root.metronomeFetch = metronomeFetch;
  if (typeof module === "object" && module && module.exports) module.exports = api;
})(typeof globalThis !== "undefined" ? globalThis : this);
