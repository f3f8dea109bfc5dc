//! The mock upstream and the client of the c=1 leg and the stall sweep of `scripts/bench.sh`
//! (scripts/bench_stream.py), measured the way the onthebench.ai gateway board's stream suite
//! measures: a mock that writes a role chunk, then N content deltas a fixed gap apart (the first at
//! once), then the finish; a client that timestamps every content frame when its read returns.
//!
//! Why a program of its own rather than `metronome sim` and `metronome probe`: the sim sleeps on
//! tokio's millisecond timer wheel, so its first token lands up to 1 ms after it is due, which is
//! larger than the figure measured (tens to hundreds of µs added); and the probe opens its
//! connections per run, where the c=1 leg needs one client holding a warm keep-alive connection
//! to every path for the whole leg, alternating between them stream by stream. The same client
//! and the same mock then serve every path, so what differs between paths is the proxy alone.
//!
//! Only the standard library, so that the bench compiles it with `rustc -O` in seconds:
//!
//!   streambench mock  --listen 127.0.0.1:PORT [--events 64] [--gap-ms 20] [--bytes 16]
//!   streambench c1    --target NAME=ADDR ... --streams 500 [--warmup 10] [--events 64]
//!                     [--mock ADDR] --out F
//!   streambench sweep --target NAME=ADDR --concurrency N --duration-s 10 [--events 64]
//!                     [--stall-ms 200] --out F
//!
//! `c1` runs rounds: in each round one stream per target, in an order rotated every round, on one
//! keep-alive connection per target opened before the warm-up rounds. `sweep` opens N connections
//! to one target, warms each with a one-event stream, then starts them together, each running
//! streams back to back until the duration is over. Both write one JSON object per stream (a line
//! each), then one line per target with the connections it opened. The mock answers `GET /stats`
//! with the connections it accepted and the streams it served; with `--mock`, c1 writes how many
//! it accepted during the counted rounds (0: every proxy kept its upstream connection warm).
//!
//! Unit tests: `rustc --edition 2021 --test scripts/lib/streambench.rs -o T && ./T`.

use std::env;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The request every stream sends; `{max}` and `{id}` are filled in.
const REQUEST_BODY: &str = r#"{"model":"bench-model","messages":[{"role":"user","content":"{id}"}],"max_tokens":{max},"stream":true}"#;
/// Stack of each connection thread: 1,024 of them must fit comfortably.
const THREAD_STACK: usize = 256 * 1024;
/// Bytes read at a time.
const READ_BYTES: usize = 16 * 1024;
/// Most content deltas one request may ask of the mock.
const MAX_EVENTS: u64 = 4096;

/// What went wrong with one stream or one connection.
#[derive(Debug)]
enum BenchError {
    /// A socket call failed.
    Io(io::Error),
    /// The peer sent something this client does not read.
    Protocol(&'static str),
    /// The connection closed before the response ended.
    Closed,
}

impl From<io::Error> for BenchError {
    fn from(e: io::Error) -> Self {
        BenchError::Io(e)
    }
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Io(e) => write!(f, "io: {e}"),
            BenchError::Protocol(what) => write!(f, "protocol: {what}"),
            BenchError::Closed => write!(f, "connection closed mid-response"),
        }
    }
}

// --- reading a streamed response -------------------------------------------------------------

/// Whether an SSE `data:` payload is a content frame as the board's client counts one: it carries
/// a non-empty `"content":"…"` (OpenAI) or `"text":"…"` (Anthropic).
fn is_content(payload: &[u8]) -> bool {
    let has = |needle: &[u8]| payload.windows(needle.len()).any(|w| w == needle);
    (has(br#""content":""#) && !has(br#""content":"""#))
        || (has(br#""text":""#) && !has(br#""text":"""#))
}

/// Where the response parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Reading the status line and the header fields.
    Head,
    /// Reading a chunk-size line.
    ChunkSize,
    /// Inside a chunk, with this many bytes left.
    ChunkData(usize),
    /// The CRLF after a chunk's data, with this many bytes of it left.
    ChunkEnd(usize),
    /// The trailer section after the last chunk.
    Trailer,
    /// A body of known length, with this many bytes left.
    Length(usize),
    /// A body that ends when the connection closes.
    UntilClose,
    /// The response has ended.
    Done,
}

/// What one read brought.
#[derive(Debug, Default, PartialEq, Eq)]
struct Fed {
    /// Content frames completed by these bytes.
    content: u32,
}

/// An HTTP/1.1 response (chunked, of known length, or until close) whose body is an SSE stream,
/// fed with the bytes of each read as they come.
#[derive(Debug)]
struct ResponseReader {
    framing: Framing,
    /// The head, or the current chunk-size or trailer line, so far.
    line: Vec<u8>,
    /// The current SSE line so far.
    sse: Vec<u8>,
    status: u16,
    close: bool,
    /// `data: [DONE]` was seen.
    done_marker: bool,
}

impl ResponseReader {
    fn new() -> Self {
        ResponseReader {
            framing: Framing::Head,
            line: Vec::new(),
            sse: Vec::new(),
            status: 0,
            close: false,
            done_marker: false,
        }
    }

    fn finished(&self) -> bool {
        self.framing == Framing::Done
    }

    /// Reads `bytes`; returns the content frames they completed.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<Fed, BenchError> {
        let mut fed = Fed::default();
        while !bytes.is_empty() {
            match self.framing {
                Framing::Head => {
                    let (used, complete) = take_until(&mut self.line, bytes, b"\r\n\r\n");
                    bytes = &bytes[used..];
                    if complete {
                        self.framing = self.parse_head()?;
                        self.line.clear();
                    }
                }
                Framing::ChunkSize => {
                    let (used, complete) = take_until(&mut self.line, bytes, b"\r\n");
                    bytes = &bytes[used..];
                    if complete {
                        let size = chunk_size(&self.line)?;
                        self.line.clear();
                        self.framing = if size == 0 {
                            Framing::Trailer
                        } else {
                            Framing::ChunkData(size)
                        };
                    }
                }
                Framing::ChunkData(left) => {
                    let n = left.min(bytes.len());
                    fed.content += self.body(&bytes[..n]);
                    bytes = &bytes[n..];
                    self.framing = if n == left {
                        Framing::ChunkEnd(2)
                    } else {
                        Framing::ChunkData(left - n)
                    };
                }
                Framing::ChunkEnd(left) => {
                    let n = left.min(bytes.len());
                    bytes = &bytes[n..];
                    self.framing = if n == left {
                        Framing::ChunkSize
                    } else {
                        Framing::ChunkEnd(left - n)
                    };
                }
                Framing::Trailer => {
                    let (used, complete) = take_until(&mut self.line, bytes, b"\r\n");
                    bytes = &bytes[used..];
                    if complete {
                        let empty = self.line.len() == 2;
                        self.line.clear();
                        if empty {
                            self.framing = Framing::Done;
                        }
                    }
                }
                Framing::Length(left) => {
                    let n = left.min(bytes.len());
                    fed.content += self.body(&bytes[..n]);
                    bytes = &bytes[n..];
                    self.framing = if n == left {
                        Framing::Done
                    } else {
                        Framing::Length(left - n)
                    };
                }
                Framing::UntilClose => {
                    fed.content += self.body(bytes);
                    bytes = &[];
                }
                Framing::Done => return Err(BenchError::Protocol("bytes after the response")),
            }
        }
        Ok(fed)
    }

    /// The connection closed: the end of an until-close body, or a cut response.
    fn eof(&mut self) -> Result<(), BenchError> {
        if self.framing == Framing::UntilClose {
            self.framing = Framing::Done;
            Ok(())
        } else {
            Err(BenchError::Closed)
        }
    }

    /// Reads the head in `self.line`; returns how the body is framed.
    fn parse_head(&mut self) -> Result<Framing, BenchError> {
        let head =
            std::str::from_utf8(&self.line).map_err(|_| BenchError::Protocol("head not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or("");
        let mut parts = status.split(' ');
        let version = parts.next().unwrap_or("");
        self.status = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or(BenchError::Protocol("bad status line"))?;
        self.close = version == "HTTP/1.0";
        let (mut chunked, mut length) = (false, None);
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or(BenchError::Protocol("bad header line"))?;
            let (name, value) = (
                name.trim().to_ascii_lowercase(),
                value.trim().to_ascii_lowercase(),
            );
            match name.as_str() {
                "transfer-encoding" => chunked = value.ends_with("chunked"),
                "content-length" => {
                    length = Some(
                        value
                            .parse()
                            .map_err(|_| BenchError::Protocol("bad content-length"))?,
                    )
                }
                "connection" if value == "close" => self.close = true,
                "connection" if value == "keep-alive" => self.close = false,
                _ => {}
            }
        }
        Ok(match (chunked, length) {
            (true, _) => Framing::ChunkSize,
            (false, Some(0)) => Framing::Done,
            (false, Some(n)) => Framing::Length(n),
            (false, None) => {
                self.close = true;
                Framing::UntilClose
            }
        })
    }

    /// Body bytes: splits them into SSE lines; returns the content frames completed.
    fn body(&mut self, bytes: &[u8]) -> u32 {
        let mut content = 0;
        for &b in bytes {
            if b != b'\n' {
                self.sse.push(b);
                continue;
            }
            let line = self.sse.strip_suffix(b"\r").unwrap_or(&self.sse);
            if let Some(payload) = line.strip_prefix(b"data:") {
                let payload = payload.trim_ascii();
                if payload == b"[DONE]" {
                    self.done_marker = true;
                } else if is_content(payload) {
                    content += 1;
                }
            }
            self.sse.clear();
        }
        content
    }
}

/// Appends `bytes` to `acc` up to and including the first `end` in `acc`; returns the bytes used
/// and whether `end` was reached.
fn take_until(acc: &mut Vec<u8>, bytes: &[u8], end: &[u8]) -> (usize, bool) {
    for (i, &b) in bytes.iter().enumerate() {
        acc.push(b);
        if acc.ends_with(end) {
            return (i + 1, true);
        }
    }
    (bytes.len(), false)
}

/// The size of a chunk-size line (hex, extensions after `;` ignored, CRLF included).
fn chunk_size(line: &[u8]) -> Result<usize, BenchError> {
    let text =
        std::str::from_utf8(line).map_err(|_| BenchError::Protocol("chunk size not UTF-8"))?;
    let hex = text
        .trim_end_matches("\r\n")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    usize::from_str_radix(hex, 16).map_err(|_| BenchError::Protocol("bad chunk size"))
}

// --- the client ------------------------------------------------------------------------------

/// One stream as the client saw it; times in nanoseconds.
#[derive(Debug, Default)]
struct StreamResult {
    status: u16,
    /// Request written -> the read that completed the first content frame.
    ttft_ns: Option<u64>,
    /// Between the reads that completed consecutive content frames (0 for frames of one read).
    gaps_ns: Vec<u64>,
    content: u32,
    /// The response ended with `data: [DONE]`.
    done: bool,
    error: Option<String>,
}

impl StreamResult {
    fn max_gap_ns(&self) -> u64 {
        self.gaps_ns.iter().copied().max().unwrap_or(0)
    }
}

/// One keep-alive connection to a target, reopened only when the server closes it.
struct Client {
    addr: String,
    socket: Option<TcpStream>,
    /// Connections opened so far (1 for a connection kept alive throughout).
    connects: u32,
    buf: Vec<u8>,
    sent: u64,
}

impl Client {
    fn new(addr: &str) -> Self {
        Client {
            addr: addr.to_string(),
            socket: None,
            connects: 0,
            buf: vec![0; READ_BYTES],
            sent: 0,
        }
    }

    fn socket(&mut self) -> Result<&mut TcpStream, BenchError> {
        if self.socket.is_none() {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(120)))?;
            self.connects += 1;
            self.socket = Some(s);
        }
        self.socket.as_mut().ok_or(BenchError::Closed)
    }

    /// Streams one response of `events` content deltas on the kept connection (a new one if the
    /// server closed it).
    fn stream(&mut self, events: u64) -> StreamResult {
        self.sent += 1;
        let body = REQUEST_BODY
            .replace("{max}", &events.to_string())
            .replace("{id}", &format!("u-{}", self.sent));
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: text/event-stream\r\nContent-Length: {}\r\n\r\n{}",
            self.addr,
            body.len(),
            body
        );
        // A kept connection the server has closed meanwhile fails at once: retry on a new one.
        let reused = self.socket.is_some();
        let mut result = self.exchange(request.as_bytes());
        if reused && result.ttft_ns.is_none() && result.error.is_some() {
            self.socket = None;
            result = self.exchange(request.as_bytes());
        }
        result
    }

    fn exchange(&mut self, request: &[u8]) -> StreamResult {
        let mut result = StreamResult::default();
        if let Err(e) = self.exchange_into(request, &mut result) {
            result.error = Some(e.to_string());
            self.socket = None;
        }
        result
    }

    fn exchange_into(
        &mut self,
        request: &[u8],
        result: &mut StreamResult,
    ) -> Result<(), BenchError> {
        let mut reader = ResponseReader::new();
        let mut buf = std::mem::take(&mut self.buf);
        let outcome = (|| {
            let socket = self.socket()?;
            let start = Instant::now();
            socket.write_all(request)?;
            let mut last = start;
            while !reader.finished() {
                let n = socket.read(&mut buf)?;
                let now = Instant::now();
                if n == 0 {
                    reader.eof()?;
                    break;
                }
                let fed = reader.feed(&buf[..n])?;
                for _ in 0..fed.content {
                    if result.ttft_ns.is_none() {
                        result.ttft_ns = Some(nanos(now - start));
                    } else {
                        result.gaps_ns.push(nanos(now - last));
                    }
                    last = now;
                }
                result.content += fed.content;
            }
            Ok(())
        })();
        self.buf = buf;
        result.status = reader.status;
        result.done = reader.done_marker;
        if reader.close {
            self.socket = None;
        }
        outcome
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One stream as a JSON line; `gaps` writes every gap.
fn stream_json(path: &str, index: u64, conn: usize, r: &StreamResult, gaps: bool) -> String {
    let mut line = format!(
        r#"{{"path":"{path}","index":{index},"conn":{conn},"status":{},"ttft_ns":{},"content":{},"done":{},"max_gap_ns":{}"#,
        r.status,
        r.ttft_ns.map_or("null".to_string(), |t| t.to_string()),
        r.content,
        r.done,
        r.max_gap_ns()
    );
    if let Some(e) = &r.error {
        let _ = write!(line, r#","error":"{}""#, e.replace(['"', '\\'], "'"));
    }
    if gaps {
        let list: Vec<String> = r.gaps_ns.iter().map(u64::to_string).collect();
        let _ = write!(line, r#","gaps_ns":[{}]"#, list.join(","));
    }
    line.push('}');
    line
}

/// The order of the targets in round `round`: rotated by one each round.
fn rotation(targets: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..targets).map(move |i| (i + round) % targets)
}

fn run_c1(opts: &Options) -> Result<(), String> {
    let mut clients: Vec<(String, Client)> = opts
        .targets
        .iter()
        .map(|(name, addr)| (name.clone(), Client::new(addr)))
        .collect();
    let mut out = Vec::new();
    let rounds = opts.warmup + opts.streams;
    let mut warm_connections = None;
    for round in 0..rounds {
        if round == opts.warmup {
            warm_connections = mock_connections(&opts.mock)?;
        }
        for i in rotation(clients.len(), round as usize) {
            let (name, client) = &mut clients[i];
            let r = client.stream(opts.events);
            if round >= opts.warmup {
                out.push(stream_json(name, round - opts.warmup, 0, &r, true));
            } else if r.error.is_some() || r.status != 200 {
                return Err(format!(
                    "warm-up stream to {name} failed: status {} {:?}",
                    r.status, r.error
                ));
            }
        }
        if opts.progress && (round + 1) % 50 == 0 {
            eprintln!("streambench c1: round {} of {rounds}", round + 1);
        }
    }
    for (name, client) in &clients {
        out.push(format!(
            r#"{{"path":"{name}","connects":{}}}"#,
            client.connects
        ));
    }
    if let (Some(warm), Some(end)) = (warm_connections, mock_connections(&opts.mock)?) {
        // The connections the mock accepted during the counted rounds (the stats requests' own
        // connections taken off): 0 when every path kept its upstream connection.
        out.push(format!(
            r#"{{"mock_connections_after_warmup":{}}}"#,
            end - warm - 1
        ));
    }
    write_out(&opts.out, &out)
}

/// The connections the mock at `addr` has accepted so far (its `GET /stats`), if one is named.
fn mock_connections(addr: &Option<String>) -> Result<Option<u64>, String> {
    let Some(addr) = addr else { return Ok(None) };
    let fetch = || -> Result<u64, BenchError> {
        let mut s = TcpStream::connect(addr)?;
        s.write_all(
            format!("GET /stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let at = text
            .find(r#""connections":"#)
            .ok_or(BenchError::Protocol("no connections in /stats"))?;
        let digits: String = text[at + 14..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits
            .parse()
            .map_err(|_| BenchError::Protocol("bad /stats"))
    };
    fetch()
        .map(Some)
        .map_err(|e| format!("mock /stats at {addr}: {e}"))
}

fn run_sweep(opts: &Options) -> Result<(), String> {
    let (name, addr) = opts
        .targets
        .first()
        .ok_or("sweep needs one --target")?
        .clone();
    let n = opts.concurrency;
    let ready = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let mut workers = Vec::with_capacity(n);
    for conn in 0..n {
        let (ready, go, deadline, addr) =
            (ready.clone(), go.clone(), deadline.clone(), addr.clone());
        let events = opts.events;
        let worker = thread::Builder::new()
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let mut client = Client::new(&addr);
                let warm = client.stream(1);
                ready.wait();
                go.wait();
                let until = deadline
                    .lock()
                    .ok()
                    .and_then(|d| *d)
                    .unwrap_or_else(Instant::now);
                let mut results = Vec::new();
                if warm.error.is_some() || warm.status != 200 {
                    results.push(warm);
                    return (results, client.connects);
                }
                loop {
                    results.push(client.stream(events));
                    if Instant::now() >= until {
                        break;
                    }
                }
                (results, client.connects)
            });
        workers.push(worker.map_err(|e| format!("thread {conn}: {e}"))?);
    }
    ready.wait();
    if let Ok(mut d) = deadline.lock() {
        *d = Some(Instant::now() + Duration::from_secs_f64(opts.duration_s));
    }
    go.wait();
    let mut out = Vec::new();
    let mut connects = 0;
    let mut index = 0;
    for (conn, worker) in workers.into_iter().enumerate() {
        let (results, c) = worker
            .join()
            .map_err(|_| format!("thread {conn} panicked"))?;
        connects += c;
        for r in &results {
            out.push(stream_json(&name, index, conn, r, opts.gaps));
            index += 1;
        }
    }
    out.push(format!(r#"{{"path":"{name}","connects":{connects}}}"#));
    write_out(&opts.out, &out)
}

fn write_out(path: &str, lines: &[String]) -> Result<(), String> {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))
}

// --- the mock upstream -----------------------------------------------------------------------

/// What the mock has done, for `GET /stats`.
#[derive(Default)]
struct MockStats {
    connections: AtomicU64,
    streams: AtomicU64,
}

/// One SSE event as an HTTP chunk.
fn chunk(event: &str) -> String {
    format!("{:x}\r\n{event}\r\n", event.len())
}

fn delta(json_delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\
         \"model\":\"bench-model\",\"choices\":[{{\"index\":0,\"delta\":{json_delta},\
         \"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// The `max_tokens` of a request body, if it has one.
fn max_tokens(body: &[u8]) -> Option<u64> {
    let key = br#""max_tokens":"#;
    let at = body.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = body[at..]
        .iter()
        .skip_while(|b| **b == b' ')
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Reads one request head and body; `None` when the client closed the connection.
fn read_request(
    socket: &mut TcpStream,
    pending: &mut Vec<u8>,
) -> io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while pending.len() < head_end + length {
        let n = socket.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..n]);
    }
    let body = pending[head_end..head_end + length].to_vec();
    pending.drain(..head_end + length);
    let target = head.split(' ').nth(1).unwrap_or("/").to_string();
    Ok(Some((target, body)))
}

fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        thread::sleep(deadline - now);
    }
}

/// Serves one connection: requests one after another, each a stream on the fixed cadence.
fn serve(mut socket: TcpStream, opts: &Options, stats: &MockStats) -> io::Result<()> {
    socket.set_nodelay(true)?;
    let mut pending = Vec::new();
    let content_text = "x".repeat(opts.bytes.saturating_sub(6));
    while let Some((target, body)) = read_request(&mut socket, &mut pending)? {
        let arrived = Instant::now();
        if target == "/stats" {
            let json = format!(
                r#"{{"connections":{},"streams":{}}}"#,
                stats.connections.load(Ordering::Relaxed),
                stats.streams.load(Ordering::Relaxed)
            );
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
                json.len()
            );
            // Then close: the caller reads to the end.
            return socket.write_all(response.as_bytes());
        }
        stats.streams.fetch_add(1, Ordering::Relaxed);
        let events = max_tokens(&body)
            .unwrap_or(opts.events)
            .clamp(1, MAX_EVENTS);
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
                    Transfer-Encoding: chunked\r\n\r\n";
        let role = chunk(&delta(r#"{"role":"assistant","content":""}"#, "null"));
        socket.write_all(format!("{head}{role}").as_bytes())?;
        // Every delta is due at the request's arrival plus k gaps: lateness never accumulates.
        for k in 0..events {
            sleep_until(arrived + opts.gap * u32::try_from(k).unwrap_or(u32::MAX));
            let text = format!("{:06}{content_text}", k % 1_000_000);
            socket.write_all(
                chunk(&delta(&format!(r#"{{"content":"{text}"}}"#), "null")).as_bytes(),
            )?;
        }
        let usage = format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\
             \"model\":\"bench-model\",\"choices\":[],\"usage\":{{\"prompt_tokens\":8,\
             \"completion_tokens\":{events},\"total_tokens\":{}}}}}\n\n",
            events + 8
        );
        let tail = format!(
            "{}{}{}0\r\n\r\n",
            chunk(&delta("{}", r#""stop""#)),
            chunk(&usage),
            chunk("data: [DONE]\n\n")
        );
        socket.write_all(tail.as_bytes())?;
    }
    Ok(())
}

fn run_mock(opts: &Options) -> Result<(), String> {
    // Sleep to the deadline, not up to 50 µs past it (the default timer slack).
    // SAFETY: prctl(PR_SET_TIMERSLACK, 1) only sets this thread's timer slack, inherited by the
    // connection threads spawned below.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1);
    }
    let listener = TcpListener::bind(&opts.listen).map_err(|e| format!("{}: {e}", opts.listen))?;
    let stats = Arc::new(MockStats::default());
    let opts = Arc::new(opts.clone());
    for socket in listener.incoming() {
        let Ok(socket) = socket else { continue };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (stats, opts) = (stats.clone(), opts.clone());
        let spawned = thread::Builder::new()
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let _ = serve(socket, &opts, &stats);
            });
        if let Err(e) = spawned {
            eprintln!("streambench mock: no thread for a connection: {e}");
        }
    }
    Ok(())
}

const PR_SET_TIMERSLACK: i32 = 29;
extern "C" {
    fn prctl(option: i32, ...) -> i32;
}

// --- options ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Options {
    listen: String,
    targets: Vec<(String, String)>,
    events: u64,
    gap: Duration,
    bytes: usize,
    streams: u64,
    warmup: u64,
    concurrency: usize,
    duration_s: f64,
    gaps: bool,
    progress: bool,
    /// The mock's address, for its `/stats` (c1).
    mock: Option<String>,
    out: String,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        listen: "127.0.0.1:8000".into(),
        targets: Vec::new(),
        events: 64,
        gap: Duration::from_millis(20),
        bytes: 16,
        streams: 500,
        warmup: 10,
        concurrency: 1,
        duration_s: 10.0,
        gaps: false,
        progress: false,
        mock: None,
        out: "/dev/stdout".into(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--listen" => o.listen = value()?,
            "--target" => {
                let v = value()?;
                let (name, addr) = v.split_once('=').ok_or("--target NAME=ADDR")?;
                o.targets.push((name.to_string(), addr.to_string()));
            }
            "--events" => o.events = num(value()?)? as u64,
            "--gap-ms" => o.gap = Duration::from_secs_f64(num(value()?)? / 1000.0),
            "--bytes" => o.bytes = num(value()?)? as usize,
            "--streams" => o.streams = num(value()?)? as u64,
            "--warmup" => o.warmup = num(value()?)? as u64,
            "--concurrency" => o.concurrency = (num(value()?)? as usize).max(1),
            "--duration-s" => o.duration_s = num(value()?)?,
            "--gaps" => o.gaps = true,
            "--progress" => o.progress = true,
            "--mock" => o.mock = Some(value()?),
            "--out" => o.out = value()?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((cmd, rest)) => parse(rest).and_then(|o| match cmd.as_str() {
            "mock" => run_mock(&o),
            "c1" => run_c1(&o),
            "sweep" => run_sweep(&o),
            _ => Err(format!("unknown command {cmd} (mock, c1, sweep)")),
        }),
        None => Err("usage: streambench mock|c1|sweep [options]".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streambench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_bytes() -> Vec<u8> {
        let mut body = String::new();
        body.push_str(&chunk(&delta(
            r#"{"role":"assistant","content":""}"#,
            "null",
        )));
        for k in 0..3 {
            body.push_str(&chunk(&delta(
                &format!(r#"{{"content":"tok{k}"}}"#),
                "null",
            )));
        }
        body.push_str(&chunk(&delta("{}", r#""stop""#)));
        body.push_str(&chunk("data: [DONE]\n\n"));
        body.push_str("0\r\n\r\n");
        format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n{body}")
            .into_bytes()
    }

    #[test]
    fn a_chunked_stream_split_anywhere_gives_three_content_frames_and_ends() {
        let bytes = stream_bytes();
        for split in 0..bytes.len() {
            let mut r = ResponseReader::new();
            let a = r.feed(&bytes[..split]).expect("first part");
            let b = r.feed(&bytes[split..]).expect("second part");
            assert_eq!(a.content + b.content, 3, "split at {split}");
            assert!(
                r.finished() && r.done_marker && r.status == 200 && !r.close,
                "split at {split}"
            );
        }
    }

    #[test]
    fn byte_by_byte_the_frames_complete_where_their_line_ends() {
        let bytes = stream_bytes();
        let mut r = ResponseReader::new();
        let total: u32 = bytes
            .iter()
            .map(|b| r.feed(std::slice::from_ref(b)).expect("byte").content)
            .sum();
        assert_eq!(total, 3);
        assert!(r.finished());
    }

    #[test]
    fn a_body_of_known_length_ends_at_its_length_and_one_until_close_at_eof() {
        let body = "data: {\"content\":\"a\"}\n\ndata: [DONE]\n\n";
        let fixed = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut r = ResponseReader::new();
        assert_eq!(r.feed(fixed.as_bytes()).expect("fixed").content, 1);
        assert!(r.finished());
        let open = format!("HTTP/1.0 200 OK\r\n\r\n{body}");
        let mut r = ResponseReader::new();
        assert_eq!(r.feed(open.as_bytes()).expect("open").content, 1);
        assert!(!r.finished() && r.close);
        r.eof().expect("eof ends it");
        assert!(r.finished());
    }

    #[test]
    fn a_cut_chunked_response_is_an_error() {
        let bytes = stream_bytes();
        let mut r = ResponseReader::new();
        r.feed(&bytes[..bytes.len() / 2]).expect("half");
        assert!(matches!(r.eof(), Err(BenchError::Closed)));
    }

    #[test]
    fn content_is_a_non_empty_content_or_text_field() {
        assert!(is_content(br#"{"choices":[{"delta":{"content":"hi"}}]}"#));
        assert!(is_content(
            br#"{"delta":{"type":"text_delta","text":"hi"}}"#
        ));
        assert!(!is_content(
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!is_content(
            br#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#
        ));
    }

    #[test]
    fn the_mock_reads_max_tokens_and_rounds_rotate() {
        assert_eq!(max_tokens(br#"{"max_tokens":64,"stream":true}"#), Some(64));
        assert_eq!(max_tokens(br#"{"max_tokens": 7}"#), Some(7));
        assert_eq!(max_tokens(br#"{"stream":true}"#), None);
        assert_eq!(rotation(3, 0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(3, 1).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(rotation(3, 5).collect::<Vec<_>>(), [2, 0, 1]);
    }

    #[test]
    fn mock_and_client_agree_over_loopback_on_one_kept_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let mut opts = parse(&[]).expect("defaults");
        opts.gap = Duration::from_millis(2);
        let stats = Arc::new(MockStats::default());
        let server_stats = stats.clone();
        thread::spawn(move || {
            for socket in listener.incoming().take(2) {
                server_stats.connections.fetch_add(1, Ordering::Relaxed);
                let _ = serve(socket.expect("accept"), &opts, &server_stats);
            }
        });
        let mut client = Client::new(&addr);
        for _ in 0..3 {
            let r = client.stream(5);
            assert_eq!(
                (r.status, r.content, r.done, r.gaps_ns.len()),
                (200, 5, true, 4),
                "{:?}",
                r.error
            );
            // The last delta is never sent before its deadline, four gaps after the first's.
            let span: u64 = r.gaps_ns.iter().sum();
            assert!(
                span >= 8_000_000,
                "the deltas follow the cadence: {:?}",
                r.gaps_ns
            );
        }
        assert_eq!(client.connects, 1);
        assert_eq!(stats.streams.load(Ordering::Relaxed), 3);
        // The stats request is the second connection the mock accepted, and it is closed after.
        drop(client);
        assert_eq!(mock_connections(&Some(addr)), Ok(Some(2)));
    }
}
