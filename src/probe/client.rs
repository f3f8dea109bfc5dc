//! Runs the streams: a pooled HTTP client, the closed or open loop that starts streams, and the
//! per-stream task that reads the body frame by frame into a [`StreamRecord`].
//!
//! Every stream ends in exactly one record, whatever happens to it: errors are recorded in it and
//! never abort the run. Failed streams slow the closed loop down, and a run whose first streams
//! all fail ends early ([`super::backoff`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, Semaphore};

use super::args::{Load, ProbeConfig, Stop};
use super::backoff::{self, Starts};
use super::secrets::Secrets;
use super::stream::{Recorder, StreamError, StreamRecord};
use super::workload::pick;
use super::ws_client::{self, WsPlan};
use crate::error::Chain;
use crate::scan::Framing;

/// The connector behind the pool: TCP, and rustls over it for https:// URLs.
type Connector = HttpsConnector<HttpConnector>;

/// The pooled client every stream of a run shares.
pub(crate) type HttpClient = Client<Connector, Full<Bytes>>;

/// Why a run could not take place at all (individual streams fail into their records instead).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL's scheme has no connector.
    #[error("`{0}` is not supported: the probe speaks http:// and https://")]
    UnsupportedScheme(String),
    /// The TLS client could not be set up (the CA file).
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The request could not be built from the configuration.
    #[error("cannot build the request: {0}")]
    InvalidRequest(String),
}

/// Every stream of one run, in start order.
#[derive(Debug, Clone)]
pub struct ProbeRun {
    /// When the run began (the first intended start in open loop).
    pub started: Instant,
    /// When the last stream ended.
    pub finished: Instant,
    /// One record per stream started, ordered by [`StreamRecord::index`].
    pub streams: Vec<StreamRecord>,
}

/// What every stream task needs, shared.
pub(crate) struct ProbeShared {
    /// One pool for the whole run, so closed-loop workers reuse their connections as a real
    /// client would.
    client: HttpClient,
    /// The run's settings (request, timeout, stop rule).
    pub(crate) config: ProbeConfig,
    /// Streams sent and ended: the progress line's "in flight", and whether to go on.
    pub(crate) starts: Arc<Starts>,
    /// `--websocket`: the messages of each request and the TLS connector, built once.
    pub(crate) ws: Option<WsPlan>,
}

/// Runs the configured load and returns every stream's record.
pub async fn measure(config: &ProbeConfig) -> Result<ProbeRun, ProbeError> {
    measure_with(config, |_| {}).await
}

/// Like [`measure`], calling `on_stream` as each stream ends (for a progress bar).
pub async fn measure_with(
    config: &ProbeConfig,
    on_stream: impl FnMut(&StreamRecord),
) -> Result<ProbeRun, ProbeError> {
    measure_counting(config, Arc::default(), on_stream).await
}

/// Like [`measure_with`], counting in `starts` every stream as it is sent and as it ends (so that
/// a progress line can tell the streams in flight, and the caller whether the run gave up).
pub async fn measure_counting(
    config: &ProbeConfig,
    starts: Arc<Starts>,
    mut on_stream: impl FnMut(&StreamRecord),
) -> Result<ProbeRun, ProbeError> {
    let client = build_client(config)?;
    // Fail on an unbuildable request once, up front, rather than in every stream.
    build_request(config, 0).map_err(|e| ProbeError::InvalidRequest(e.to_string()))?;
    let ws = config
        .websocket
        .map(|settings| WsPlan::new(config, settings))
        .transpose()?;
    let shared = Arc::new(ProbeShared {
        client,
        config: config.clone(),
        starts,
        ws,
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    match config.load {
        Load::Closed { concurrency } if shared.ws.is_some() => {
            ws_client::closed_loop(&shared, concurrency, started, &tx);
        }
        Load::Closed { concurrency } => closed_loop(&shared, concurrency, started, &tx),
        Load::Open {
            rate,
            max_in_flight,
        } => {
            tokio::spawn(open_loop(
                shared.clone(),
                rate,
                max_in_flight,
                started,
                tx.clone(),
            ));
        }
    }
    // The channel closes once every task holding a sender has finished.
    drop(tx);
    let mut streams = Vec::new();
    while let Some(record) = rx.recv().await {
        on_stream(&record);
        streams.push(record);
    }
    streams.sort_by_key(|r| r.index);
    Ok(ProbeRun {
        started,
        finished: Instant::now(),
        streams,
    })
}

/// The pooled client for `config`'s URL (also used to ask `/v1/models`).
pub(crate) fn build_client(config: &ProbeConfig) -> Result<HttpClient, ProbeError> {
    let mut tls = match config.url.scheme_str() {
        Some("https") => crate::tls::client_config(config.ca.as_deref(), None)?,
        // No certificate is ever checked: reading the system's roots would only cost start-up.
        Some("http") => crate::tls::client_config_without_roots()?,
        other => {
            return Err(ProbeError::UnsupportedScheme(format!(
                "{}://",
                other.unwrap_or("")
            )))
        }
    };
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(config.timeout));
    tcp.enforce_http(false);
    // ALPN offers exactly the protocol asked for, so an https server cannot switch the probe to
    // another one than the run claims to measure, and one that does not speak it refuses the
    // handshake. (hyper-rustls's builder would offer nothing at all for HTTP/1.1.)
    tls.alpn_protocols = vec![if config.http2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let connector = hyper_rustls::HttpsConnector::from((tcp, tls));
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .http2_only(config.http2)
        .build(connector))
}

/// Stream `index`'s request: the body, or the dataset line [`pick`] chooses for it.
fn build_request(config: &ProbeConfig, index: u64) -> Result<Request<Full<Bytes>>, http::Error> {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(config.url.clone());
    if let Some(headers) = builder.headers_mut() {
        headers.extend(config.headers.clone());
    }
    let body = match config.bodies.len() {
        0 => config.body.clone(),
        n => config.bodies[pick(index, n, config.seed)].clone(),
    };
    builder.body(Full::new(body))
}

/// `concurrency` workers, each starting its next stream as soon as its previous one ends, or,
/// after a failed one, after its backoff.
fn closed_loop(
    shared: &Arc<ProbeShared>,
    concurrency: usize,
    started: Instant,
    tx: &mpsc::UnboundedSender<StreamRecord>,
) {
    let next = Arc::new(AtomicU64::new(0));
    for _ in 0..concurrency {
        let (shared, next, tx) = (shared.clone(), next.clone(), tx.clone());
        tokio::spawn(async move {
            let mut failures_in_a_row = 0;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                if shared.starts.gave_up() || !may_start(shared.config.stop, index, now, started) {
                    break;
                }
                let record = run_stream(&shared, index, now).await;
                failures_in_a_row = match record.error {
                    Some(_) => failures_in_a_row + 1,
                    None => 0,
                };
                if tx.send(record).is_err() {
                    break;
                }
                let wait = backoff::wait_after(failures_in_a_row, backoff::jitter());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
        });
    }
}

/// Starts stream `i` at `started + i / rate`, however the earlier ones are doing, until the run
/// gives up.
async fn open_loop(
    shared: Arc<ProbeShared>,
    rate: f64,
    max_in_flight: Option<usize>,
    started: Instant,
    tx: mpsc::UnboundedSender<StreamRecord>,
) {
    let limit = max_in_flight.map(|n| Arc::new(Semaphore::new(n)));
    for index in 0u64.. {
        let scheduled = started + Duration::from_secs_f64(index as f64 / rate);
        if !may_start(shared.config.stop, index, scheduled, started) {
            break;
        }
        tokio::time::sleep_until(scheduled.into()).await;
        if shared.starts.gave_up() {
            break;
        }
        let permit = match &limit {
            Some(limit) => match limit.clone().acquire_owned().await {
                Ok(permit) => Some(permit),
                Err(_) => break,
            },
            None => None,
        };
        let (shared, tx) = (shared.clone(), tx.clone());
        tokio::spawn(async move {
            let record = match shared.ws {
                Some(_) => ws_client::run_one(&shared, index, scheduled).await,
                None => run_stream(&shared, index, scheduled).await,
            };
            drop(permit);
            let _ = tx.send(record);
        });
    }
}

/// Whether stream `index`, starting at `at`, is within the run's stop rule.
pub(crate) fn may_start(stop: Stop, index: u64, at: Instant, started: Instant) -> bool {
    match stop {
        Stop::Requests(n) => index < n,
        Stop::After(duration) => at < started + duration,
    }
}

/// Runs one stream to its end (or its timeout) and returns its record.
async fn run_stream(shared: &ProbeShared, index: u64, scheduled: Instant) -> StreamRecord {
    let mut record = StreamRecord::new(index, scheduled);
    let request = match build_request(&shared.config, index) {
        Ok(request) => request,
        Err(e) => {
            record.error = Some(StreamError::Request(e.to_string()));
            record.finished = Some(Instant::now());
            return record;
        }
    };
    let sent = Instant::now();
    record.sent = Some(sent);
    shared.starts.sent_one();
    let timeout = shared.config.timeout;
    let outcome = tokio::time::timeout_at(
        (sent + timeout).into(),
        read_stream(shared, request, &mut record),
    )
    .await;
    let now = Instant::now();
    record.finished = Some(now);
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => record.error = Some(error),
        Err(_elapsed) => record.error = Some(StreamError::Timeout(timeout)),
    }
    shared.starts.ended_one(record.error.is_some());
    record
}

async fn read_stream(
    shared: &ProbeShared,
    request: Request<Full<Bytes>>,
    record: &mut StreamRecord,
) -> Result<(), StreamError> {
    let response = shared.client.request(request).await.map_err(|e| {
        if is_canceled(&e) {
            StreamError::ConnectCanceled(Chain(&e).to_string())
        } else if e.is_connect() {
            StreamError::Connect(Chain(&e).to_string())
        } else {
            StreamError::Request(Chain(&e).to_string())
        }
    })?;
    let status = response.status();
    record.status = Some(status.as_u16());
    record.stream_id = response
        .headers()
        .get(&shared.config.stream_id_header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !status.is_success() {
        record.error_body = error_body(response.into_body(), &shared.config.secrets).await;
        return Err(StreamError::Status(status.as_u16()));
    }
    let framing = match response.headers().get(CONTENT_TYPE) {
        Some(ct) if ct.as_bytes().starts_with(b"application/x-ndjson") => Framing::Ndjson,
        _ => Framing::Sse,
    };
    let mut recorder = Recorder::reading_think(framing, &shared.config.think);
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| StreamError::Body(Chain(&e).to_string()))?;
        if let Some(data) = frame.data_ref() {
            // One clock reading per frame: every event in it arrived now.
            recorder.frame(data, Instant::now(), record);
        }
    }
    recorder.finish(Instant::now(), record);
    match record.error.take() {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// At most this many bytes of an error response's body are read, and this many characters shown.
const ERROR_BODY_BYTES: usize = 1024;
/// See [`ERROR_BODY_BYTES`].
const ERROR_BODY_CHARS: usize = 300;

/// The start of a non-2xx response's body, on one line and truncated, so the report says what
/// the server objected to (`{"error":"model not found"}`), with any credential it echoes masked.
/// `None` when the body is empty.
async fn error_body(mut body: hyper::body::Incoming, secrets: &Secrets) -> Option<String> {
    let mut bytes = Vec::new();
    while bytes.len() < ERROR_BODY_BYTES {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            _ => break,
        }
    }
    one_line(
        &secrets.redact(&String::from_utf8_lossy(&bytes)),
        ERROR_BODY_CHARS,
    )
}

/// `text` with its whitespace runs folded to one space, cut at `max` characters (with `...`).
pub(crate) fn one_line(text: &str, max: usize) -> Option<String> {
    let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.is_empty() {
        return None;
    }
    if folded.chars().count() <= max {
        return Some(folded);
    }
    let cut: String = folded.chars().take(max).collect();
    Some(cut + "...")
}

/// Whether hyper-util gave the connect up without a reason of its own (its pool's
/// `CheckoutNoLongerWanted`, when another stream's attempt to the same server failed first): a
/// connect error with no I/O error behind it, since every failure to connect, resolve or
/// handshake carries the `std::io::Error` that says why. tests/it/tls.rs (the probe against an
/// unknown CA) checks both sides of that line.
fn is_canceled(error: &hyper_util::client::legacy::Error) -> bool {
    error.is_connect() && !crate::error::is_caused_by::<std::io::Error>(error)
}
