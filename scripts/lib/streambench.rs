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
//! Only the standard library (epoll, timerfd and eventfd declared `extern "C"`, as `prctl`), so
//! that the bench compiles it with `rustc -O` in seconds:
//!
//!   streambench mock  --listen 127.0.0.1:PORT [--events 64] [--gap-ms 20] [--bytes 16]
//!                     [--threads 1]
//!   streambench c1    --target NAME=ADDR ... --streams 500 [--warmup 10] [--events 64]
//!                     [--mock ADDR] --out F
//!   streambench sweep --target NAME=ADDR --concurrency N --duration-s 10 [--events 64]
//!                     [--threads 1] --out F
//!
//! Both generators run on a thread or two: with one thread per connection each, as they were, the
//! sweep's 512 and 1,024 streams put a thousand or two threads on the two cores beside the proxy,
//! and the sweep measured the scheduler rather than the proxy. The mock serves every connection from
//! `--threads` epoll event loops (the accepting loop hands connections out in turn): per
//! connection it reads a request, writes the head and role chunk at once, then each delta when
//! due, then the tail. Every delta is due at the request's arrival plus k gaps, so lateness never
//! accumulates; each loop keeps its deadlines in a min-heap and sleeps on a timerfd armed at the
//! earliest, at an absolute CLOCK_MONOTONIC time, which the kernel fires without timer slack. A
//! write that would block keeps the rest of the bytes, in order, for the socket's next EPOLLOUT.
//!
//! `c1` runs rounds: in each round one stream per target, in the order of a Williams design's row
//! (each target runs right after each other equally often: `round_order`), on one
//! blocking keep-alive connection per target opened before the warm-up rounds. `sweep` opens N
//! connections to one target, shared by `--threads` epoll event loops, warms each with a
//! one-event stream, then starts them together, each running streams back to back until the
//! duration is over; it opens its connections with a blocking connect (immediate on loopback).
//! Both clients take a frame's time when the read that completed it returns, and parse with the
//! same incremental reader. Both write one JSON object per stream (a line each), then one line
//! per target with the connections it opened. The mock answers `GET /stats` with the connections
//! it accepted and the streams it served, then closes; with `--mock`, c1 writes how many it
//! accepted during the counted rounds (0: every proxy kept its upstream connection warm).
//!
//! Unit tests: `rustc --edition 2021 --test scripts/lib/streambench.rs -o T && ./T`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::env;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The request every stream sends; `{max}` and `{id}` are filled in.
const REQUEST_BODY: &str = r#"{"model":"bench-model","messages":[{"role":"user","content":"{id}"}],"max_tokens":{max},"stream":true}"#;
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

/// The request of stream number `sent` on a connection to `addr`, asking `events` deltas.
fn request_text(addr: &str, events: u64, sent: u64) -> String {
    let body = REQUEST_BODY
        .replace("{max}", &events.to_string())
        .replace("{id}", &format!("u-{sent}"));
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
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
        let request = request_text(&self.addr, events, self.sent);
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

/// The order of the targets in round `round`: the rows of a Williams design, so that over every
/// `targets` rounds (twice that many for an odd count) each target runs right after each other
/// target equally often. A stream starts while the target before it may still be finishing its
/// own (a proxy's end-of-stream work, its timers): with the order only rotated, each target
/// always followed the same one, and a build compared as a second metronome path (always right
/// after the first) read 9-35 µs slower at the median than the same build in the first's place
/// (`METRONOME_BIN=A bash scripts/bench.sh --only c1 --stream-events 4 --board-paths
/// direct,metronome,metronome-before,passthrough,nginx --baseline B`, with A = B and swapped).
fn round_order(targets: usize, round: usize) -> Vec<usize> {
    let n = targets.max(1);
    let rows = if n % 2 == 0 { n } else { 2 * n };
    let row = round % rows;
    // The first row is 0, 1, n-1, 2, n-2, ...; row r adds r to each; an odd count's second n
    // rows are the first n reversed.
    let mut order: Vec<usize> = (0..targets)
        .map(|k| {
            let first = if k % 2 == 1 { (k + 1) / 2 } else { (n - k / 2) % n };
            (first + row) % n
        })
        .collect();
    if row >= n {
        order.reverse();
    }
    order
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
        for i in round_order(clients.len(), round as usize) {
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

/// How long a sweep stream may wait for its next bytes before it fails (the c1 client's read
/// timeout).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// One connection of the sweep and the stream it is running.
struct SweepConn {
    /// Its number among the sweep's connections.
    index: usize,
    socket: Option<TcpStream>,
    /// Connections opened so far (1 for a connection kept alive throughout).
    connects: u32,
    sent: u64,
    request: Vec<u8>,
    /// How many bytes of `request` are written.
    written: usize,
    reader: ResponseReader,
    result: StreamResult,
    /// Just before the request's write, and when the read of the last content frame returned.
    start: Instant,
    last: Instant,
    /// When the stream began or its socket last gave bytes.
    active: Instant,
    running: bool,
    /// The stream went out on a kept connection: failing before its first frame (the server
    /// closed the connection meanwhile), it is retried once on a new one.
    reused: bool,
    results: Vec<StreamResult>,
}

impl SweepConn {
    /// Writes what is left of the request, then reads what has come; returns whether the
    /// response has ended.
    fn pump(&mut self, buf: &mut [u8]) -> Result<bool, BenchError> {
        let mut socket = self.socket.as_ref().ok_or(BenchError::Closed)?;
        while self.written < self.request.len() {
            match socket.write(&self.request[self.written..]) {
                Ok(0) => return Err(BenchError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        loop {
            match socket.read(buf) {
                Ok(0) => {
                    self.reader.eof()?;
                    return Ok(true);
                }
                Ok(n) => {
                    // A frame has the time its read returned.
                    let now = Instant::now();
                    self.active = now;
                    let fed = self.reader.feed(&buf[..n])?;
                    for _ in 0..fed.content {
                        if self.result.ttft_ns.is_none() {
                            self.result.ttft_ns = Some(nanos(now - self.start));
                        } else {
                            self.result.gaps_ns.push(nanos(now - self.last));
                        }
                        self.last = now;
                    }
                    self.result.content += fed.content;
                    if self.reader.finished() {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// What a connection does next; queued, so that streams failing at once do not recurse.
#[derive(Clone, Copy)]
enum Next {
    /// A new stream.
    Stream,
    /// The same request again, on a new connection.
    Retry,
}

/// One event loop of the sweep client: a share of the connections, all driven by one epoll.
struct SweepLoop {
    addr: String,
    poller: Poller,
    conns: Vec<SweepConn>,
    buf: Vec<u8>,
    queue: VecDeque<(usize, Next)>,
    /// Connections with a stream under way.
    running: usize,
    events: u64,
    /// Streams follow one another until this instant; `None`: one stream each (the warm-up).
    until: Option<Instant>,
    /// The last look for streams past READ_TIMEOUT.
    expired_at: Instant,
}

impl SweepLoop {
    fn new(addr: &str, indices: impl Iterator<Item = usize>) -> io::Result<Self> {
        let now = Instant::now();
        let conns = indices
            .map(|index| SweepConn {
                index,
                socket: None,
                connects: 0,
                sent: 0,
                request: Vec::new(),
                written: 0,
                reader: ResponseReader::new(),
                result: StreamResult::default(),
                start: now,
                last: now,
                active: now,
                running: false,
                reused: false,
                results: Vec::new(),
            })
            .collect();
        Ok(SweepLoop {
            addr: addr.to_string(),
            poller: Poller::new()?,
            conns,
            buf: vec![0; READ_BYTES],
            queue: VecDeque::new(),
            running: 0,
            events: 1,
            until: None,
            expired_at: now,
        })
    }

    /// Opens every connection and runs one one-event stream on each.
    fn warm(&mut self) -> io::Result<()> {
        self.events = 1;
        self.until = None;
        self.queue
            .extend((0..self.conns.len()).map(|i| (i, Next::Stream)));
        self.drive()
    }

    /// On every connection whose warm-up stream went well (one that failed keeps it as its only
    /// result), streams of `events` back to back until `until`.
    fn run(&mut self, events: u64, until: Instant) -> io::Result<()> {
        self.events = events;
        self.until = Some(until);
        for (i, conn) in self.conns.iter_mut().enumerate() {
            match conn.results.pop() {
                Some(warm) if warm.error.is_none() && warm.status == 200 => {
                    self.queue.push_back((i, Next::Stream));
                }
                Some(warm) => conn.results.push(warm),
                None => {}
            }
        }
        self.drive()
    }

    /// Runs the queue and the ready sockets until no stream is left.
    fn drive(&mut self) -> io::Result<()> {
        let mut ready = Vec::new();
        loop {
            while let Some((i, next)) = self.queue.pop_front() {
                if let Next::Stream = next {
                    let conn = &mut self.conns[i];
                    conn.sent += 1;
                    conn.request = request_text(&self.addr, self.events, conn.sent).into_bytes();
                    conn.reused = conn.socket.is_some();
                }
                self.attempt(i);
            }
            if self.running == 0 {
                return Ok(());
            }
            self.poller.wait(1000, &mut ready)?;
            for &(token, _) in &ready {
                self.pump(token as usize);
            }
            self.expire();
        }
    }

    /// Sends connection `i`'s request (on a new connection if it has none) and reads what came.
    fn attempt(&mut self, i: usize) {
        let conn = &mut self.conns[i];
        conn.reader = ResponseReader::new();
        conn.result = StreamResult::default();
        conn.running = true;
        self.running += 1;
        if conn.socket.is_none() {
            match connect(&self.addr, &self.poller, i) {
                Ok(socket) => {
                    conn.socket = Some(socket);
                    conn.connects += 1;
                }
                Err(e) => return self.end(i, Err(e)),
            }
        }
        conn.start = Instant::now();
        conn.last = conn.start;
        conn.active = conn.start;
        conn.written = 0;
        // Edge-triggered: read until the socket would block, so no edge is missed.
        self.pump(i);
    }

    fn pump(&mut self, i: usize) {
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        if !conn.running {
            return;
        }
        match conn.pump(&mut self.buf) {
            Ok(false) => {}
            Ok(true) => self.end(i, Ok(())),
            Err(e) => self.end(i, Err(e)),
        }
    }

    /// The stream on connection `i` ended: keeps its result (or retries it), queues the next.
    fn end(&mut self, i: usize, outcome: Result<(), BenchError>) {
        let conn = &mut self.conns[i];
        conn.running = false;
        self.running -= 1;
        conn.result.status = conn.reader.status;
        conn.result.done = conn.reader.done_marker;
        if conn.reader.close {
            conn.socket = None;
        }
        if let Err(e) = outcome {
            conn.result.error = Some(e.to_string());
            conn.socket = None;
        }
        // A kept connection the server has closed meanwhile fails at once: retry on a new one.
        if conn.reused && conn.result.ttft_ns.is_none() && conn.result.error.is_some() {
            conn.reused = false;
            conn.socket = None;
            self.queue.push_back((i, Next::Retry));
            return;
        }
        conn.results.push(std::mem::take(&mut conn.result));
        if self.until.is_some_and(|until| Instant::now() < until) {
            self.queue.push_back((i, Next::Stream));
        }
    }

    /// Fails the streams that got no bytes for READ_TIMEOUT (looked at once a second).
    fn expire(&mut self) {
        let now = Instant::now();
        if now - self.expired_at < Duration::from_secs(1) {
            return;
        }
        self.expired_at = now;
        for i in 0..self.conns.len() {
            let conn = &self.conns[i];
            if conn.running && now - conn.active > READ_TIMEOUT {
                self.end(i, Err(BenchError::Io(io::ErrorKind::TimedOut.into())));
            }
        }
    }
}

/// A new connection to `addr`, nonblocking, watched by `poller` with `token`.
fn connect(addr: &str, poller: &Poller, token: usize) -> Result<TcpStream, BenchError> {
    let socket = TcpStream::connect(addr)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    poller.add(
        socket.as_raw_fd(),
        token as u64,
        EPOLLIN | EPOLLOUT | EPOLLET,
    )?;
    Ok(socket)
}

/// The sweep against `addr`: `opts.concurrency` connections shared by `opts.threads` event
/// loops, warmed, then started together. Returns each connection's streams and the connections
/// it opened, in connection order.
fn sweep(addr: &str, opts: &Options) -> Result<Vec<(Vec<StreamResult>, u32)>, String> {
    let n = opts.concurrency;
    let loops = opts.threads.clamp(1, n);
    let ready = Arc::new(Barrier::new(loops + 1));
    let go = Arc::new(Barrier::new(loops + 1));
    let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let mut workers = Vec::with_capacity(loops);
    for t in 0..loops {
        let (ready, go, deadline, addr) = (
            ready.clone(),
            go.clone(),
            deadline.clone(),
            addr.to_string(),
        );
        let events = opts.events;
        let worker = thread::Builder::new().spawn(move || {
            let warmed = SweepLoop::new(&addr, (t..n).step_by(loops))
                .and_then(|mut lp| lp.warm().map(|()| lp));
            // Every loop meets both barriers, failed or not, so that none waits forever.
            ready.wait();
            go.wait();
            let mut lp = warmed.map_err(|e| format!("loop {t}: {e}"))?;
            let until = deadline
                .lock()
                .ok()
                .and_then(|d| *d)
                .unwrap_or_else(Instant::now);
            lp.run(events, until)
                .map_err(|e| format!("loop {t}: {e}"))?;
            Ok::<_, String>(
                lp.conns
                    .into_iter()
                    .map(|c| (c.index, c.results, c.connects))
                    .collect::<Vec<_>>(),
            )
        });
        workers.push(worker.map_err(|e| format!("thread {t}: {e}"))?);
    }
    ready.wait();
    if let Ok(mut d) = deadline.lock() {
        *d = Some(Instant::now() + Duration::from_secs_f64(opts.duration_s));
    }
    go.wait();
    let mut conns: Vec<(Vec<StreamResult>, u32)> = (0..n).map(|_| (Vec::new(), 0)).collect();
    for worker in workers {
        let done = worker.join().map_err(|_| "a sweep loop panicked")??;
        for (index, results, connects) in done {
            conns[index] = (results, connects);
        }
    }
    Ok(conns)
}

fn run_sweep(opts: &Options) -> Result<(), String> {
    let (name, addr) = opts
        .targets
        .first()
        .ok_or("sweep needs one --target")?
        .clone();
    let conns = sweep(&addr, opts)?;
    let mut out = Vec::new();
    let mut connects = 0;
    let mut index = 0;
    for (conn, (results, c)) in conns.iter().enumerate() {
        connects += c;
        for r in results {
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

// --- the event loops' system calls -----------------------------------------------------------

/// One epoll event as the kernel lays it out (packed on x86_64).
#[cfg_attr(target_arch = "x86_64", repr(C, packed))]
#[cfg_attr(not(target_arch = "x86_64"), repr(C))]
#[derive(Clone, Copy)]
struct EpollEvent {
    events: u32,
    data: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[repr(C)]
struct Itimerspec {
    it_interval: Timespec,
    it_value: Timespec,
}

const PR_SET_TIMERSLACK: i32 = 29;
const EPOLL_CLOEXEC: i32 = 0o2_000_000;
const EPOLL_CTL_ADD: i32 = 1;
const EPOLLIN: u32 = 0x1;
const EPOLLOUT: u32 = 0x4;
const EPOLLERR: u32 = 0x8;
const EPOLLHUP: u32 = 0x10;
const EPOLLET: u32 = 1 << 31;
const CLOCK_MONOTONIC: i32 = 1;
/// TFD_NONBLOCK | TFD_CLOEXEC, the same bits as EFD_NONBLOCK | EFD_CLOEXEC.
const FD_NONBLOCK_CLOEXEC: i32 = 0o4000 | 0o2_000_000;
const TFD_TIMER_ABSTIME: i32 = 1;

extern "C" {
    fn prctl(option: i32, ...) -> i32;
    fn epoll_create1(flags: i32) -> i32;
    fn epoll_ctl(epfd: i32, op: i32, fd: i32, event: *mut EpollEvent) -> i32;
    fn epoll_wait(epfd: i32, events: *mut EpollEvent, maxevents: i32, timeout: i32) -> i32;
    fn timerfd_create(clockid: i32, flags: i32) -> i32;
    fn timerfd_settime(fd: i32, flags: i32, new: *const Itimerspec, old: *mut Itimerspec) -> i32;
    fn eventfd(initval: u32, flags: i32) -> i32;
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    fn listen(fd: i32, backlog: i32) -> i32;
}

/// A new file descriptor returned by a system call, or its error.
fn owned_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call just returned this descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the mock's deadlines and of its timerfd.
fn mono_ns() -> u64 {
    let mut ts = Timespec::default();
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets the calling thread's timer slack (inherited by the threads it spawns later) to 1 ns, so
/// that a timed wait ends at its deadline rather than up to 50 µs past it (the default slack).
fn one_ns_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK, 1) only sets this thread's timer slack.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1u64);
    }
}

/// An epoll instance whose registrations carry a token (a connection's number).
struct Poller {
    fd: OwnedFd,
    events: Vec<EpollEvent>,
}

impl Poller {
    fn new() -> io::Result<Self> {
        // SAFETY: a plain system call.
        let fd = owned_fd(unsafe { epoll_create1(EPOLL_CLOEXEC) })?;
        Ok(Poller {
            fd,
            events: vec![EpollEvent { events: 0, data: 0 }; 256],
        })
    }

    /// Watches `fd` for `events` (with EPOLLET: edge-triggered), reported with `token`.
    fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut event = EpollEvent {
            events,
            data: token,
        };
        // SAFETY: epoll_ctl reads one event from a valid pointer.
        if unsafe { epoll_ctl(self.fd.as_raw_fd(), EPOLL_CTL_ADD, fd, &mut event) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until something is ready or `timeout_ms` passed (-1: no limit); fills `ready` with
    /// each ready registration's token and events.
    fn wait(&mut self, timeout_ms: i32, ready: &mut Vec<(u64, u32)>) -> io::Result<()> {
        ready.clear();
        let len = i32::try_from(self.events.len()).unwrap_or(i32::MAX);
        // SAFETY: epoll_wait writes at most `len` events into the buffer, which holds that many.
        let n = unsafe {
            epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                len,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        for e in &self.events[..n as usize] {
            let (token, events) = (e.data, e.events);
            ready.push((token, events));
        }
        Ok(())
    }
}

/// A timerfd armed at absolute CLOCK_MONOTONIC deadlines: the kernel fires it at its deadline
/// (a timerfd's timer takes no slack), which the c=1 leg's tens of µs need.
struct Timer {
    file: std::fs::File,
    armed: Option<u64>,
}

impl Timer {
    fn new() -> io::Result<Self> {
        // SAFETY: a plain system call.
        let fd = owned_fd(unsafe { timerfd_create(CLOCK_MONOTONIC, FD_NONBLOCK_CLOEXEC) })?;
        Ok(Timer {
            file: fd.into(),
            armed: None,
        })
    }

    /// Arms the timer at `at` (ns of CLOCK_MONOTONIC), or disarms it; a call that changes nothing
    /// makes no system call.
    fn arm(&mut self, at: Option<u64>) -> io::Result<()> {
        if at == self.armed {
            return Ok(());
        }
        // A zero it_value disarms, so a deadline is at least 1 ns after boot.
        let ns = at.map_or(0, |t| t.max(1));
        let spec = Itimerspec {
            it_interval: Timespec::default(),
            it_value: Timespec {
                tv_sec: (ns / 1_000_000_000) as i64,
                tv_nsec: (ns % 1_000_000_000) as i64,
            },
        };
        // SAFETY: timerfd_settime reads one itimerspec from a valid pointer; the old one is not
        // asked for.
        let rc = unsafe {
            timerfd_settime(
                self.file.as_raw_fd(),
                TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed = at;
        Ok(())
    }

    /// The timer fired: takes its expiry count, so that the next arm takes effect.
    fn fired(&mut self) {
        let _ = (&self.file).read(&mut [0u8; 8]);
        self.armed = None;
    }
}

/// An eventfd one thread writes to wake another's event loop.
struct Waker {
    file: std::fs::File,
}

impl Waker {
    fn new() -> io::Result<Self> {
        // SAFETY: a plain system call.
        let fd = owned_fd(unsafe { eventfd(0, FD_NONBLOCK_CLOEXEC) })?;
        Ok(Waker { file: fd.into() })
    }

    fn wake(&self) {
        let _ = (&self.file).write(&1u64.to_ne_bytes());
    }

    /// Takes the wake-ups so far (the eventfd is level-triggered until read).
    fn drain(&self) {
        let _ = (&self.file).read(&mut [0u8; 8]);
    }
}

/// Bytes waiting to be written to a nonblocking socket, in order: what a write would block on
/// waits for the socket's next EPOLLOUT.
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    /// How many of `bytes` are written.
    at: usize,
}

impl Outbox {
    /// Queues `bytes` after those waiting, then writes what the socket takes.
    fn send(&mut self, socket: &TcpStream, bytes: &[u8]) -> io::Result<()> {
        self.bytes.extend_from_slice(bytes);
        self.flush(socket)
    }

    /// Writes what the socket takes of the bytes waiting.
    fn flush(&mut self, mut socket: &TcpStream) -> io::Result<()> {
        while self.at < self.bytes.len() {
            match socket.write(&self.bytes[self.at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.bytes.clear();
        self.at = 0;
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }
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

/// Takes one complete request (a head, then a body of its content-length) off the front of
/// `pending`: its target and body; `None` until all of it has arrived.
fn take_request(pending: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let head_end = pending.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&pending[..head_end]).to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if pending.len() < head_end + length {
        return None;
    }
    let body = pending[head_end..head_end + length].to_vec();
    pending.drain(..head_end + length);
    let target = head.split(' ').nth(1).unwrap_or("/").to_string();
    Some((target, body))
}

/// The bytes of the mock's answers.
struct Replies {
    /// Each delta's content after its six-digit number (`--bytes` in all).
    filler: String,
}

impl Replies {
    fn new(bytes: usize) -> Self {
        Replies {
            filler: "x".repeat(bytes.saturating_sub(6)),
        }
    }

    /// The head of a stream and its role chunk, written at once.
    fn head(&self) -> String {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
             Transfer-Encoding: chunked\r\n\r\n";
        let role = chunk(&delta(r#"{"role":"assistant","content":""}"#, "null"));
        format!("{head}{role}")
    }

    /// Content delta number `k` (from 0).
    fn content(&self, k: u64) -> String {
        let text = format!("{:06}{}", k % 1_000_000, self.filler);
        chunk(&delta(&format!(r#"{{"content":"{text}"}}"#), "null"))
    }

    /// The finish, the usage of `events` deltas, `[DONE]` and the last chunk.
    fn tail(&self, events: u64) -> String {
        let usage = format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\
             \"model\":\"bench-model\",\"choices\":[],\"usage\":{{\"prompt_tokens\":8,\
             \"completion_tokens\":{events},\"total_tokens\":{}}}}}\n\n",
            events + 8
        );
        format!(
            "{}{}{}0\r\n\r\n",
            chunk(&delta("{}", r#""stop""#)),
            chunk(&usage),
            chunk("data: [DONE]\n\n")
        )
    }

    fn stats(&self, stats: &MockStats) -> String {
        let json = format!(
            r#"{{"connections":{},"streams":{}}}"#,
            stats.connections.load(Ordering::Relaxed),
            stats.streams.load(Ordering::Relaxed)
        );
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
            json.len()
        )
    }
}

/// The stream a mock connection is writing.
struct MockStream {
    /// When its request was read (ns of CLOCK_MONOTONIC): delta k is due k gaps later.
    arrived: u64,
    events: u64,
    /// The next delta to write.
    next: u64,
}

/// One connection of the mock: requests one after another, each a stream on the fixed cadence.
struct MockConn {
    socket: TcpStream,
    /// Bytes read and not yet taken as a request.
    pending: Vec<u8>,
    out: Outbox,
    stream: Option<MockStream>,
    /// The peer closed its side: close once every complete request it sent is answered.
    peer_closed: bool,
    /// Close once `out` is written (after `/stats`).
    closing: bool,
}

impl MockConn {
    /// Writes the deltas of the current stream due by `now` and, after the last, the tail; returns
    /// when the next delta is due, if one is still to come.
    fn deliver(&mut self, now: u64, gap_ns: u64, replies: &Replies) -> io::Result<Option<u64>> {
        let Some(s) = self.stream.as_mut() else {
            return Ok(None);
        };
        while s.next < s.events {
            // Every delta is due at the request's arrival plus k gaps: lateness never accumulates.
            let due = s.arrived + s.next * gap_ns;
            if due > now {
                return Ok(Some(due));
            }
            self.out
                .send(&self.socket, replies.content(s.next).as_bytes())?;
            s.next += 1;
        }
        let events = s.events;
        self.stream = None;
        self.out
            .send(&self.socket, replies.tail(events).as_bytes())?;
        Ok(None)
    }
}

/// The registration tokens that are not connections.
const LISTENER: u64 = u64::MAX;
const TIMER: u64 = u64::MAX - 1;
const WAKER: u64 = u64::MAX - 2;

/// Where the accepting loop hands a connection to another loop.
struct Handoff {
    inbox: Mutex<Vec<TcpStream>>,
    waker: Waker,
}

/// One event loop of the mock: its connections, their next deltas' deadlines, one timerfd.
struct MockLoop {
    poller: Poller,
    timer: Timer,
    /// The listener, on the loop that accepts.
    listener: Option<TcpListener>,
    /// Every loop's handoff, and this loop's number among them.
    handoffs: Arc<Vec<Handoff>>,
    me: usize,
    /// Connections accepted, for the round-robin.
    accepted: usize,
    conns: HashMap<u64, MockConn>,
    next_id: u64,
    /// (deadline, connection) of every connection's next delta; the earliest arms the timer.
    due: BinaryHeap<Reverse<(u64, u64)>>,
    gap_ns: u64,
    default_events: u64,
    replies: Replies,
    stats: Arc<MockStats>,
}

impl MockLoop {
    fn new(
        opts: &Options,
        listener: Option<TcpListener>,
        handoffs: Arc<Vec<Handoff>>,
        me: usize,
        stats: Arc<MockStats>,
    ) -> io::Result<Self> {
        let poller = Poller::new()?;
        let timer = Timer::new()?;
        poller.add(timer.file.as_raw_fd(), TIMER, EPOLLIN)?;
        poller.add(handoffs[me].waker.file.as_raw_fd(), WAKER, EPOLLIN)?;
        if let Some(l) = &listener {
            l.set_nonblocking(true)?;
            poller.add(l.as_raw_fd(), LISTENER, EPOLLIN)?;
        }
        Ok(MockLoop {
            poller,
            timer,
            listener,
            handoffs,
            me,
            accepted: 0,
            conns: HashMap::new(),
            next_id: 0,
            due: BinaryHeap::new(),
            gap_ns: nanos(opts.gap),
            default_events: opts.events,
            replies: Replies::new(opts.bytes),
            stats,
        })
    }

    fn run(mut self) -> io::Result<()> {
        let mut ready = Vec::new();
        loop {
            self.timer
                .arm(self.due.peek().map(|Reverse((at, _))| *at))?;
            self.poller.wait(-1, &mut ready)?;
            for &(token, events) in &ready {
                match token {
                    LISTENER => self.accept(),
                    TIMER => self.timer.fired(),
                    WAKER => {
                        self.handoffs[self.me].waker.drain();
                        let taken = self.handoffs[self.me]
                            .inbox
                            .lock()
                            .map(|mut v| std::mem::take(&mut *v))
                            .unwrap_or_default();
                        for socket in taken {
                            self.add(socket);
                        }
                    }
                    id => self.on_ready(id, events),
                }
            }
            self.deliver_due();
        }
    }

    /// Accepts what is waiting; the connections go to the loops in turn.
    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((socket, _)) => {
                    self.stats.connections.fetch_add(1, Ordering::Relaxed);
                    let to = self.accepted % self.handoffs.len();
                    self.accepted += 1;
                    if to == self.me {
                        self.add(socket);
                    } else if let Ok(mut inbox) = self.handoffs[to].inbox.lock() {
                        inbox.push(socket);
                        self.handoffs[to].waker.wake();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("streambench mock: accept: {e}");
                    return;
                }
            }
        }
    }

    fn add(&mut self, socket: TcpStream) {
        let id = self.next_id;
        self.next_id += 1;
        let setup = socket
            .set_nonblocking(true)
            .and_then(|()| socket.set_nodelay(true))
            .and_then(|()| {
                self.poller
                    .add(socket.as_raw_fd(), id, EPOLLIN | EPOLLOUT | EPOLLET)
            });
        if let Err(e) = setup {
            eprintln!("streambench mock: a connection: {e}");
            return;
        }
        let conn = MockConn {
            socket,
            pending: Vec::new(),
            out: Outbox::default(),
            stream: None,
            peer_closed: false,
            closing: false,
        };
        self.conns.insert(id, conn);
    }

    fn on_ready(&mut self, id: u64, events: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        // The peer reset or is gone both ways: nothing more can be written.
        if events & (EPOLLERR | EPOLLHUP) != 0 {
            self.conns.remove(&id);
            return;
        }
        if conn.out.flush(&conn.socket).is_err() {
            self.conns.remove(&id);
            return;
        }
        if events & EPOLLIN != 0 {
            let mut buf = [0u8; 4096];
            loop {
                match (&conn.socket).read(&mut buf) {
                    Ok(0) => {
                        conn.peer_closed = true;
                        break;
                    }
                    Ok(n) => conn.pending.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.conns.remove(&id);
                        return;
                    }
                }
            }
        }
        self.serve(id);
    }

    /// Starts the next request's answer when the connection is between streams; closes it when
    /// it has nothing more to do.
    fn serve(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut outcome = Ok(());
        while conn.stream.is_none() && !conn.closing && outcome.is_ok() {
            let Some((target, body)) = take_request(&mut conn.pending) else {
                conn.closing = conn.peer_closed;
                break;
            };
            let arrived = mono_ns();
            if target == "/stats" {
                // Then close: the caller reads to the end.
                conn.closing = true;
                outcome = conn
                    .out
                    .send(&conn.socket, self.replies.stats(&self.stats).as_bytes());
                break;
            }
            self.stats.streams.fetch_add(1, Ordering::Relaxed);
            let events = max_tokens(&body)
                .unwrap_or(self.default_events)
                .clamp(1, MAX_EVENTS);
            conn.stream = Some(MockStream {
                arrived,
                events,
                next: 0,
            });
            outcome = conn
                .out
                .send(&conn.socket, self.replies.head().as_bytes())
                .and_then(|()| conn.deliver(arrived, self.gap_ns, &self.replies))
                .map(|next| {
                    if let Some(at) = next {
                        self.due.push(Reverse((at, id)));
                    }
                });
        }
        if outcome.is_err() || (conn.closing && conn.out.is_empty()) {
            self.conns.remove(&id);
        }
    }

    /// Writes every delta due by now.
    fn deliver_due(&mut self) {
        let now = mono_ns();
        while let Some(&Reverse((at, id))) = self.due.peek() {
            if at > now {
                return;
            }
            self.due.pop();
            let Some(conn) = self.conns.get_mut(&id) else {
                continue;
            };
            match conn.deliver(now, self.gap_ns, &self.replies) {
                Ok(Some(next)) => self.due.push(Reverse((next, id))),
                // The stream ended: a request sent meanwhile is answered now.
                Ok(None) => self.serve(id),
                Err(_) => {
                    self.conns.remove(&id);
                }
            }
        }
    }
}

/// The mock's accept queue: a proxy opening its upstream connections for 1,024 streams at once
/// must not overflow it (std listens with 128, and a dropped SYN costs its stream 1 s). The
/// kernel caps it at net.core.somaxconn.
const MOCK_BACKLOG: i32 = 4096;

/// Serves `listener` from `opts.threads` event loops until the process ends.
fn serve_mock(listener: TcpListener, opts: &Options, stats: Arc<MockStats>) -> io::Result<()> {
    // SAFETY: listen() again on a listening socket only sets its backlog.
    if unsafe { listen(listener.as_raw_fd(), MOCK_BACKLOG) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let loops = opts.threads.max(1);
    let handoffs: Vec<Handoff> = (0..loops)
        .map(|_| {
            Ok(Handoff {
                inbox: Mutex::new(Vec::new()),
                waker: Waker::new()?,
            })
        })
        .collect::<io::Result<_>>()?;
    let handoffs = Arc::new(handoffs);
    for me in 1..loops {
        let worker = MockLoop::new(opts, None, handoffs.clone(), me, stats.clone())?;
        thread::spawn(move || {
            if let Err(e) = worker.run() {
                eprintln!("streambench mock: loop {me}: {e}");
            }
        });
    }
    MockLoop::new(opts, Some(listener), handoffs, 0, stats)?.run()
}

fn run_mock(opts: &Options) -> Result<(), String> {
    one_ns_timer_slack();
    let listener = TcpListener::bind(&opts.listen).map_err(|e| format!("{}: {e}", opts.listen))?;
    serve_mock(listener, opts, Arc::new(MockStats::default())).map_err(|e| format!("mock: {e}"))
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
    /// Event loops of the mock, or of the sweep client.
    threads: usize,
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
        threads: 1,
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
            "--threads" => o.threads = (num(value()?)? as usize).max(1),
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
    fn the_mock_reads_max_tokens() {
        assert_eq!(max_tokens(br#"{"max_tokens":64,"stream":true}"#), Some(64));
        assert_eq!(max_tokens(br#"{"max_tokens": 7}"#), Some(7));
        assert_eq!(max_tokens(br#"{"stream":true}"#), None);
    }

    /// Every round runs every target once, and over a whole design (n rounds, 2n for odd n)
    /// each target runs right after each other target equally often, and first equally often.
    #[test]
    fn each_target_follows_each_other_equally_often() {
        assert_eq!(round_order(1, 0), [0]);
        assert_eq!(round_order(4, 0), [0, 1, 3, 2]);
        for n in 1..=7usize {
            let rows = if n % 2 == 0 { n } else { 2 * n };
            let mut after = vec![vec![0usize; n]; n];
            let mut first = vec![0usize; n];
            for round in 0..rows {
                let order = round_order(n, round);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} round {round}");
                assert_eq!(order, round_order(n, round + rows), "the design repeats");
                first[order[0]] += 1;
                for pair in order.windows(2) {
                    after[pair[0]][pair[1]] += 1;
                }
            }
            assert!(first.iter().all(|&c| c == first[0]), "n {n}: {first:?}");
            let pairs: Vec<usize> = (0..n)
                .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
                .map(|(a, b)| after[a][b])
                .collect();
            assert!(pairs.iter().all(|&c| c == pairs[0]), "n {n}: {after:?}");
            assert!(n == 1 || pairs[0] > 0, "n {n}");
        }
    }

    /// A mock of `loops` event loops on a free loopback port: its address and its stats.
    fn start_mock(mut opts: Options, loops: usize) -> (String, Arc<MockStats>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        opts.threads = loops;
        let stats = Arc::new(MockStats::default());
        let server_stats = stats.clone();
        thread::spawn(move || serve_mock(listener, &opts, server_stats));
        (addr, stats)
    }

    fn gap_opts(gap_ms: u64) -> Options {
        let mut opts = parse(&[]).expect("defaults");
        opts.gap = Duration::from_millis(gap_ms);
        opts
    }

    #[test]
    fn mock_and_client_agree_over_loopback_on_one_kept_connection() {
        let (addr, stats) = start_mock(gap_opts(2), 1);
        let mut client = Client::new(&addr);
        for _ in 0..3 {
            let r = client.stream(5);
            assert_eq!(
                (r.status, r.content, r.done, r.gaps_ns.len()),
                (200, 5, true, 4),
                "{:?}",
                r.error
            );
            // The last delta is never sent before its deadline, four gaps after the request
            // arrived (a late first read shortens the span between frames, not this).
            let last = r.ttft_ns.unwrap_or(0) + r.gaps_ns.iter().sum::<u64>();
            assert!(
                last >= 8_000_000,
                "the deltas follow the cadence: {:?} {:?}",
                r.ttft_ns,
                r.gaps_ns
            );
        }
        assert_eq!(client.connects, 1);
        assert_eq!(stats.streams.load(Ordering::Relaxed), 3);
        // The stats request is the second connection the mock accepted, and it is closed after.
        drop(client);
        assert_eq!(mock_connections(&Some(addr)), Ok(Some(2)));
    }

    #[test]
    fn the_mock_answers_with_the_bytes_of_the_thread_per_connection_mock() {
        // What the mock wrote before it ran on an event loop (main at 6e91942), byte for byte,
        // for a request of two deltas whose client then closed its side.
        let expected = concat!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n",
            "Transfer-Encoding: chunked\r\n\r\n",
            "b9\r\ndata: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,",
            "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",",
            "\"content\":\"\"},\"finish_reason\":null}]}\n\n\r\n",
            "b6\r\ndata: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,",
            "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":",
            "\"000000xxxxxxxxxx\"},\"finish_reason\":null}]}\n\n\r\n",
            "b6\r\ndata: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,",
            "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":",
            "\"000001xxxxxxxxxx\"},\"finish_reason\":null}]}\n\n\r\n",
            "9c\r\ndata: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,",
            "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{},",
            "\"finish_reason\":\"stop\"}]}\n\n\r\n",
            "b3\r\ndata: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,",
            "\"model\":\"bench-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":8,",
            "\"completion_tokens\":2,\"total_tokens\":10}}\n\n\r\n",
            "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
        );
        let (addr, _) = start_mock(gap_opts(1), 1);
        let mut s = TcpStream::connect(&addr).expect("connect");
        let body = r#"{"max_tokens":2}"#;
        write!(
            s,
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut got = String::new();
        // The mock closes once the request is answered, so this ends.
        s.read_to_string(&mut got).expect("read to the close");
        assert_eq!(got, expected);
    }

    #[test]
    fn a_reader_too_slow_for_the_socket_buffers_gets_every_byte_in_order() {
        // 100 deltas of 64 KiB at once: 6.5 MB, more than a loopback socket buffers, so the
        // mock's writes would block while this client does not read.
        let mut opts = gap_opts(0);
        opts.bytes = 64 * 1024;
        let (addr, _) = start_mock(opts, 1);
        let mut slow = TcpStream::connect(&addr).expect("connect");
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        slow.write_all(request_text(&addr, 100, 1).as_bytes())
            .expect("write");
        thread::sleep(Duration::from_millis(300));
        // Meanwhile the mock's loop serves another connection on its cadence.
        let mut other = Client::new(&addr);
        let started = Instant::now();
        let r = other.stream(3);
        assert_eq!(
            (r.status, r.content, r.done),
            (200, 3, true),
            "{:?}",
            r.error
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut reader = ResponseReader::new();
        let (mut content, mut bytes) = (0, Vec::new());
        let mut buf = vec![0u8; 8192];
        while !reader.finished() {
            let n = slow.read(&mut buf).expect("read");
            assert!(n > 0, "the mock closed mid-response");
            content += reader
                .feed(&buf[..n])
                .expect("a well-formed response")
                .content;
            bytes.extend_from_slice(&buf[..n]);
        }
        assert_eq!((content, reader.done_marker), (100, true));
        assert!(bytes.len() > 6_500_000, "{} bytes", bytes.len());
        // Every delta, in order: their numbers are 0, 1, 2 ...
        let key = br#""content":""#;
        let numbers: Vec<u64> = bytes
            .windows(key.len() + 6)
            .filter(|w| w.starts_with(key))
            .filter_map(|w| std::str::from_utf8(&w[key.len()..]).ok()?.parse().ok())
            .collect();
        assert_eq!(numbers, (0..100).collect::<Vec<u64>>());
    }

    #[test]
    fn the_event_loop_sweep_runs_every_connection_to_its_end_on_the_cadence() {
        let (addr, stats) = start_mock(gap_opts(5), 2);
        let mut opts = gap_opts(5);
        opts.concurrency = 8;
        opts.threads = 3;
        opts.events = 5;
        opts.duration_s = 0.3;
        let conns = sweep(&addr, &opts).expect("sweep");
        assert_eq!(conns.len(), 8);
        let mut streams = 0;
        for (conn, (results, connects)) in conns.iter().enumerate() {
            assert_eq!(*connects, 1, "connection {conn} was kept");
            assert!(!results.is_empty(), "connection {conn} ran streams");
            for r in results {
                assert_eq!(
                    (r.status, r.content, r.done, r.gaps_ns.len()),
                    (200, 5, true, 4),
                    "connection {conn}: {:?}",
                    r.error
                );
                let ttft = r.ttft_ns.unwrap_or(u64::MAX);
                // The last delta is not sent before its deadline, four gaps of 5 ms after the
                // request arrived; and no stream comes near a stall.
                let last = ttft + r.gaps_ns.iter().sum::<u64>();
                assert!(
                    ttft < 1_000_000_000 && (20_000_000..1_000_000_000).contains(&last),
                    "connection {conn}: {ttft} {:?}",
                    r.gaps_ns
                );
            }
            streams += results.len();
        }
        // Back to back for 0.3 s, each 20 ms or more: several streams per connection.
        assert!(streams >= 8 * 3, "{streams} streams");
        // The warm-up streams, then every stream counted; one connection each, then the stats'.
        assert_eq!(stats.streams.load(Ordering::Relaxed), 8 + streams as u64);
        assert_eq!(mock_connections(&Some(addr)), Ok(Some(9)));
    }

    /// A server that answers each connection's first request with a one-frame response of
    /// known length, which does not say it will close, then closes.
    fn start_closing_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        thread::spawn(move || {
            for socket in listener.incoming() {
                let Ok(mut socket) = socket else { continue };
                thread::spawn(move || {
                    let (mut pending, mut buf) = (Vec::new(), [0u8; 4096]);
                    while take_request(&mut pending).is_none() {
                        match socket.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = "data: {\"content\":\"a\"}\n\ndata: [DONE]\n\n";
                    let _ = write!(
                        socket,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        addr
    }

    #[test]
    fn a_sweep_stream_on_a_connection_the_server_closed_is_retried_on_a_new_one() {
        let addr = start_closing_server();
        let mut opts = parse(&[]).expect("defaults");
        opts.concurrency = 2;
        opts.events = 1;
        opts.duration_s = 0.2;
        let conns = sweep(&addr, &opts).expect("sweep");
        for (results, connects) in &conns {
            assert!(!results.is_empty());
            for r in results {
                assert_eq!(
                    (r.status, r.content, r.done),
                    (200, 1, true),
                    "{:?}",
                    r.error
                );
            }
            // The warm-up's connection, then a new one for every stream: each found its kept
            // connection closed and was sent again.
            assert_eq!(*connects as usize, results.len() + 1);
        }
    }

    #[test]
    fn the_sweep_reports_a_target_that_refuses_as_failed_streams() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let mut opts = parse(&[]).expect("defaults");
        opts.concurrency = 3;
        opts.duration_s = 0.1;
        let conns = sweep(&addr, &opts).expect("sweep");
        // The warm-up fails on each connection, which is its only result.
        for (results, connects) in &conns {
            assert_eq!((results.len(), *connects), (1, 0));
            assert!(results[0].error.is_some() && results[0].status == 0);
        }
    }
}
