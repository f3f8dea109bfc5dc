//! The configuration: one TOML file, every key with a default, overridden by flags and
//! `METRONOME_*` environment variables.
//!
//! A bad file never half-starts the proxy: [`Config::load`] reads it, rejects unknown keys, and
//! validates every value, collecting each problem with the key it belongs to, so one run of
//! `metronome check-config` lists them all.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Deserialize;

use crate::format::Format;
use crate::metrics::{Buckets, MetricsConfig, MAX_BOUNDS};
use crate::units::parse_duration;
use validate::validate;

mod batch;
mod kinds;
pub mod otlp;
mod validate;

pub use batch::BatchSettings;
pub use kinds::{ClientKind, ServerKind};

/// Arguments of `metronome serve`: the file, and the overrides operators reach for most.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// The TOML configuration file (every key is optional; see config/metronome.toml).
    #[arg(long, env = "METRONOME_CONFIG")]
    pub config: Option<PathBuf>,
    /// Proxy listener address (overrides `server.listen`).
    #[arg(long, env = "METRONOME_LISTEN")]
    pub listen: Option<String>,
    /// Default upstream URL (overrides `server.upstream`).
    #[arg(long, env = "METRONOME_UPSTREAM")]
    pub upstream: Option<String>,
    /// Admin listener address for /metrics, /healthz, /readyz (overrides `server.admin`).
    #[arg(long, env = "METRONOME_ADMIN")]
    pub admin: Option<String>,
    /// Stall threshold, e.g. `200ms` (overrides `metering.stall_threshold`).
    #[arg(long, env = "METRONOME_STALL_THRESHOLD")]
    pub stall_threshold: Option<String>,
    /// PEM certificate chain: the proxy listener speaks TLS (overrides `tls.cert`).
    #[arg(long, env = "METRONOME_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<String>,
    /// PEM private key of --tls-cert (overrides `tls.key`).
    #[arg(long, env = "METRONOME_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<String>,
}

/// One problem in a configuration: the key it belongs to and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted key, e.g. `routes[2].upstream`.
    pub key: String,
    /// What is wrong, as a sentence.
    pub reason: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigError(pub Vec<ConfigProblem>);

impl ConfigError {
    /// The same problems, each that validation found (no line yet) given the line and column
    /// where the text writes its key, or its table when the key is missing, as a parse problem
    /// has them.
    fn located_in(self, text: &str) -> Self {
        let problems = self.0.into_iter().map(|mut problem| {
            if !problem.reason.starts_with("line ") {
                if let Some((line, column)) = crate::config_spans::locate(text, &problem.key) {
                    problem.reason = format!("line {line}, column {column}: {}", problem.reason);
                }
            }
            problem
        });
        ConfigError(problems.collect())
    }

    /// Renames the problems of keys whose value came from a flag or an environment variable:
    /// `METRONOME_ADMIN` when that variable holds the value, the flag otherwise.
    fn named_by(self, overrides: &[(&str, &str, &str, &Option<String>)]) -> Self {
        let problems = self.0.into_iter().map(|mut problem| {
            let from = overrides
                .iter()
                .find(|(key, _, _, value)| *key == problem.key && value.is_some());
            if let Some((_, flag, env, Some(value))) = from {
                let from_env = std::env::var(env).is_ok_and(|v| &v == value);
                problem.key = if from_env {
                    env.to_string()
                } else {
                    flag.to_string()
                };
            }
            problem
        });
        ConfigError(problems.collect())
    }

    fn one(key: &str, reason: impl Into<String>) -> Self {
        ConfigError(vec![ConfigProblem {
            key: key.to_string(),
            reason: reason.into(),
        }])
    }
}

/// The file as written: strings where the validated [`Config`] has parsed values.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    server: RawServer,
    timeouts: RawTimeouts,
    metering: RawMetering,
    models: ModelsConfig,
    buckets: Buckets,
    /// `[metrics]`: native histograms, the classic preset, the flush interval, the names.
    metrics: MetricsConfig,
    /// `[otlp]`: OpenTelemetry export.
    otlp: otlp::RawOtlp,
    timeline: TimelineConfig,
    tls: RawTls,
    upstream_tls: RawUpstreamTls,
    limits: LimitsConfig,
    routes: Vec<RawRoute>,
    readiness: RawReadiness,
    /// `[batch]`: batch-wide hitches and their episodes.
    batch: RawBatch,
    /// `[admin]`: the admin listener's own bounds.
    admin: RawAdmin,
}

/// `[admin]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAdmin {
    max_connections: usize,
    head_timeout: String,
    idle_timeout: String,
    max_header_bytes: usize,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            max_connections: 128,
            head_timeout: "10s".into(),
            idle_timeout: "60s".into(),
            max_header_bytes: 16 * 1024,
        }
    }
}

/// `[admin]`, validated: the admin listener's bounds, apart from the proxy listener's so that a
/// client of one can never use up what the other needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Admin connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// How long a client may take to send a request head, from its connection (or the first
    /// byte of a later request) to the blank line that ends it.
    pub head_timeout: Duration,
    /// How long a connection may wait for its next request, or for its answer to be taken.
    pub idle_timeout: Duration,
    /// Largest request head (request line and headers), in bytes; larger ones get 431.
    pub max_header_bytes: usize,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTls {
    cert: String,
    key: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawUpstreamTls {
    ca: String,
    client_cert: String,
    client_key: String,
}

/// Limits that keep an overloaded proxy answering (503, 431, 413) instead of growing memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Client connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Requests in flight at once (streams included); more are answered 503.
    pub max_requests: usize,
    /// Largest request head (request line and headers), in bytes; larger ones get 431.
    pub max_header_bytes: usize,
    /// Largest request body, in bytes; larger ones get 413.
    pub max_request_body_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: 16_384,
            max_requests: 16_384,
            max_header_bytes: 64 * 1024,
            max_request_body_bytes: 32 * 1024 * 1024,
        }
    }
}

/// TLS on the proxy listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// TLS towards https upstreams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM CA bundle; `None` uses the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate and key for mTLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Stream timelines (`/streams`) and the browser beacon.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimelineConfig {
    /// Finished streams kept for `/streams` (0 keeps none).
    pub max_streams: usize,
    /// Frames kept per stream (0 keeps none).
    pub max_frames: usize,
    /// Path on the proxy listener that takes browser beacons; empty turns beacons off.
    pub beacon_path: String,
    /// Largest beacon body accepted, in bytes.
    pub beacon_max_bytes: usize,
    /// How much longer than the stream lasted (at metronome) a beacon's TTFT and gaps may add
    /// up to: the network and the page's own delays (`"10s"`).
    #[serde(deserialize_with = "duration_text")]
    pub beacon_margin: Duration,
    /// Whether `/streams/{id}` shows each frame's size (off by default, since an SSE
    /// chat stream's frame sizes are its tokens' lengths; timings are shown either way).
    pub frame_sizes: bool,
}

impl Default for TimelineConfig {
    fn default() -> Self {
        TimelineConfig {
            max_streams: 256,
            max_frames: 1024,
            beacon_path: "/.well-known/metronome/beacon".into(),
            beacon_max_bytes: 16 * 1024,
            beacon_margin: Duration::from_secs(10),
            frame_sizes: false,
        }
    }
}

/// A duration as people write it (`10s`, `1m30s`), up to an hour, read by `crate::units`.
fn duration_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    match crate::units::parse_duration(&text) {
        Ok(v) if v <= Duration::from_secs(3600) => Ok(v),
        Ok(_) => Err(serde::de::Error::custom(format!(
            "`{text}` is longer than an hour"
        ))),
        Err(e) => Err(serde::de::Error::custom(e)),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawServer {
    listen: String,
    admin: String,
    upstream: String,
    drain_grace: String,
    workers: u64,
    threading: String,
    upstream_client: String,
    http1_server: String,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: "0.0.0.0:8080".into(),
            admin: "127.0.0.1:9464".into(),
            upstream: "http://127.0.0.1:8000".into(),
            drain_grace: "30s".into(),
            workers: 0,
            threading: "per_core".into(),
            upstream_client: "native".into(),
            http1_server: "native".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTimeouts {
    connect: String,
    first_byte: String,
    idle: String,
    tls_handshake: String,
    client_idle: String,
    client_head: String,
    upstream_idle: String,
    // The protocol sniff's own deadline, shorter than `client_idle`: a client that never says
    // which protocol it speaks holds a descriptor only this long.
    sniff: String,
    websocket_idle: String,
}

impl Default for RawTimeouts {
    fn default() -> Self {
        RawTimeouts {
            connect: "5s".into(),
            first_byte: "300s".into(),
            idle: "120s".into(),
            tls_handshake: "10s".into(),
            client_idle: "300s".into(),
            client_head: "10s".into(),
            upstream_idle: "4s".into(),
            sniff: "5s".into(),
            websocket_idle: "300s".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawMetering {
    enabled: bool,
    content_types: Vec<String>,
    stall_threshold: String,
    max_event_bytes: usize,
    buffer_bytes: usize,
    buffer_frames: usize,
    stream_id_header: String,
    max_usage_body_bytes: usize,
}

impl Default for RawMetering {
    fn default() -> Self {
        RawMetering {
            enabled: true,
            content_types: vec!["text/event-stream".into(), "application/x-ndjson".into()],
            stall_threshold: "200ms".into(),
            max_event_bytes: crate::scan::DEFAULT_MAX_EVENT_BYTES,
            buffer_bytes: 256 * 1024,
            buffer_frames: 1024,
            stream_id_header: "x-metronome-stream-id".into(),
            max_usage_body_bytes: 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawBatch {
    enabled: bool,
    gap_ratio: f64,
    min_gap: String,
    min_streams: u64,
    min_share: f64,
    lookback: String,
    rate_window: String,
    false_positive: f64,
}

impl Default for RawBatch {
    fn default() -> Self {
        RawBatch {
            enabled: true,
            gap_ratio: 4.0,
            min_gap: "20ms".into(),
            min_streams: 2,
            min_share: 0.5,
            lookback: "2s".into(),
            rate_window: "30s".into(),
            false_positive: 1e-6,
        }
    }
}

/// `[batch]` checked into [`BatchSettings`]; each problem is reported under its key, and the
/// defaults stand in for what is wrong (the problems fail the configuration anyway).
fn validate_batch(raw: &RawBatch, problem: &mut dyn FnMut(&str, String)) -> BatchSettings {
    let mut settings = BatchSettings {
        enabled: raw.enabled,
        ..BatchSettings::default()
    };
    if raw.gap_ratio.is_finite() && raw.gap_ratio >= 1.0 && raw.gap_ratio <= 1000.0 {
        settings.gap_ratio = raw.gap_ratio;
    } else {
        problem(
            "batch.gap_ratio",
            format!("{} must be a number from 1 to 1000", raw.gap_ratio),
        );
    }
    match parse_duration(&raw.min_gap) {
        Ok(d) if d <= MAX_DURATION => settings.min_gap = d,
        Ok(_) => problem(
            "batch.min_gap",
            format!("`{}` is longer than a year", raw.min_gap),
        ),
        Err(e) => problem("batch.min_gap", e),
    }
    match usize::try_from(raw.min_streams) {
        Ok(n) if n >= 1 => settings.min_streams = n,
        _ => problem(
            "batch.min_streams",
            format!("{} must be at least 1", raw.min_streams),
        ),
    }
    if raw.min_share.is_finite() && raw.min_share > 0.0 && raw.min_share <= 1.0 {
        settings.min_share = raw.min_share;
    } else {
        problem(
            "batch.min_share",
            format!("{} must be a share above 0 and at most 1", raw.min_share),
        );
    }
    match parse_duration(&raw.lookback) {
        Ok(d) if d <= MAX_DURATION => settings.lookback = d,
        Ok(_) => problem(
            "batch.lookback",
            format!("`{}` is longer than a year", raw.lookback),
        ),
        Err(e) => problem("batch.lookback", e),
    }
    match parse_duration(&raw.rate_window) {
        Ok(d) if d >= Duration::from_secs(1) && d <= MAX_DURATION => settings.rate_window = d,
        Ok(_) => problem(
            "batch.rate_window",
            format!("`{}` must be from 1s to a year", raw.rate_window),
        ),
        Err(e) => problem("batch.rate_window", e),
    }
    if raw.false_positive.is_finite() && raw.false_positive > 0.0 && raw.false_positive <= 1.0 {
        settings.false_positive = raw.false_positive;
    } else {
        problem(
            "batch.false_positive",
            format!(
                "{} must be a chance above 0 and at most 1",
                raw.false_positive
            ),
        );
    }
    settings
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawReadiness {
    check_upstream: bool,
    path: String,
    interval: String,
    timeout: String,
}

impl Default for RawReadiness {
    fn default() -> Self {
        RawReadiness {
            check_upstream: true,
            path: String::new(),
            interval: "5s".into(),
            timeout: "2s".into(),
        }
    }
}

/// How `/readyz` decides that the default upstream answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessConfig {
    /// When false, `/readyz` depends on draining only.
    pub check_upstream: bool,
    /// `None`: a TCP connection that opens is enough. `Some(path)`: `GET path` must answer 2xx.
    pub path: Option<http::uri::PathAndQuery>,
    /// Time between two checks.
    pub interval: Duration,
    /// How long one check may take before it counts as failed.
    pub timeout: Duration,
}

/// How the `model` label is bounded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// When non-empty, only these model names become labels; the rest are `other`.
    pub allow: Vec<String>,
    /// Otherwise the first `max` names seen become labels; the rest are `other`.
    pub max: usize,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            allow: Vec::new(),
            max: 32,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: String,
    path: String,
    #[serde(default, rename = "match")]
    match_kind: Option<String>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    upstream: Option<String>,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    think_tags: Option<Vec<String>>,
    #[serde(default)]
    think_starts_open: Option<bool>,
}

/// How a route's path is compared with the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMatch {
    /// The request path equals the route's.
    Exact,
    /// The request path starts with the route's.
    Prefix,
}

/// A validated route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// The `route` label value.
    pub name: String,
    /// The path to match.
    pub path: String,
    /// How to match it.
    pub match_kind: PathMatch,
    /// Only this method matches, when set.
    pub method: Option<http::Method>,
    /// Where matching requests go.
    pub upstream: Upstream,
    /// The streaming API of this route's responses when configured; `None` (`auto`) detects it
    /// per stream from the content type, the request path and the first events.
    pub format: Option<Format>,
    /// How its streams show thinking without a reasoning parser (`think_tags`,
    /// `think_starts_open`).
    pub think: crate::format::ThinkSettings,
}

/// A validated upstream base URL (`http://host:port`, optionally with a path prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http` or `https`.
    pub scheme: http::uri::Scheme,
    /// `host:port`.
    pub authority: http::uri::Authority,
    /// A path prefix put before every request path (empty or starting with `/`, no trailing `/`).
    pub base_path: String,
}

// === impl Upstream ===

impl Upstream {
    /// Parses and checks an upstream URL.
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("`{text}` is not a URL ({e})"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("`{text}` has no scheme (write http://host:port)"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!("`{text}`: the scheme must be http or https"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("`{text}` has no host"))?;
        if authority.as_str().contains('@') {
            // It would be logged and echoed in error answers, and hyper does not send it anyway.
            return Err(
                "credentials in an upstream URL are not supported (they would reach the logs); \
                 send them as request headers"
                    .to_string(),
            );
        }
        if uri.query().is_some() {
            return Err(format!("`{text}`: an upstream URL cannot have a query"));
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        Ok(Upstream {
            scheme,
            authority,
            base_path,
        })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

/// The validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[server]`: the listeners, the default upstream and how connections are served.
    pub server: ServerConfig,
    /// `[timeouts]`: how long each wait may last.
    pub timeouts: TimeoutsConfig,
    /// `[metering]`: what is metered and the bounds of metering it.
    pub metering: MeteringConfig,
    /// Bounds on the `model` label.
    pub models: ModelsConfig,
    /// Histogram buckets (with `metrics.classic`'s preset applied).
    pub buckets: Buckets,
    /// How histograms are published: native buckets, the classic preset.
    pub metrics: MetricsConfig,
    /// How often running streams' counts are flushed into the metrics (`metrics.flush_interval`);
    /// `None` (`0s`): only when each stream ends.
    pub flush_interval: Option<Duration>,
    /// `[otlp]`: where OTLP metrics go; `None` when OTLP is off (the default).
    pub otlp: Option<otlp::OtlpConfig>,
    /// Stream timelines and the browser beacon.
    pub timeline: TimelineConfig,
    /// TLS on the proxy listener, when configured.
    pub tls: Option<ListenerTls>,
    /// TLS towards https upstreams.
    pub upstream_tls: UpstreamTls,
    /// Overload limits.
    pub limits: LimitsConfig,
    /// Routes, in the order they are tried.
    pub routes: Vec<RouteConfig>,
    /// The upstream check behind `/readyz`.
    pub readiness: ReadinessConfig,
    /// `[batch]`: batch-wide hitches and episodes.
    pub batch: BatchSettings,
    /// `[admin]`: the admin listener's bounds.
    pub admin: AdminConfig,
}

/// `[server]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Proxy listener address.
    pub listen: SocketAddr,
    /// Admin listener address.
    pub admin: SocketAddr,
    /// Upstream of requests that match no route, and of routes without their own.
    pub upstream: Upstream,
    /// How long SIGTERM waits for in-flight streams.
    pub drain_grace: Duration,
    /// How the proxy listener's connections are spread over threads.
    pub threading: Threading,
    /// Which HTTP/1.1 client plain-http upstreams go through.
    pub upstream_client: ClientKind,
    /// Which HTTP/1.1 server serves client connections that speak HTTP/1.x.
    pub http1_server: ServerKind,
    /// Threads serving the proxy listener; `None`: one per CPU this process may use.
    pub workers: Option<std::num::NonZeroUsize>,
}

/// `[timeouts]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutsConfig {
    /// Connecting to the upstream.
    pub connect: Duration,
    /// From sending the request to the upstream's response head.
    pub first_byte: Duration,
    /// Longest silence between two upstream frames of a stream.
    pub idle: Duration,
    /// How long a client may take to finish the TLS handshake.
    pub tls_handshake: Duration,
    /// How long a client connection may wait for its next request before metronome closes it:
    /// longer than the keep-alive timeout of whatever sits in front, so that metronome never
    /// closes a connection the client is about to reuse.
    pub client_idle: Duration,
    /// How long a client may take to send a request head, from its first byte to its last: a
    /// head begun and never finished holds its connection and bytes only this long, not
    /// `client_idle`.
    pub client_head: Duration,
    /// How long an idle upstream connection waits in the pool for its next request: shorter than
    /// the upstream's own keep-alive timeout, so that metronome never sends a request on a
    /// connection the upstream is closing (the request would fail with a 502).
    pub upstream_idle: Duration,
    /// How long a plain-TCP client may take to send the first bytes that tell HTTP/1 from
    /// HTTP/2 (`timeouts.sniff`); bounded by `client_idle` too.
    pub sniff: Duration,
    /// How long a WebSocket tunnel may carry no byte either way before metronome closes it
    /// with a 1001 close frame to both ends.
    pub websocket_idle: Duration,
}

/// `[metering]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeteringConfig {
    /// When false, every response is passed through unmetered (to measure what metering costs).
    pub enabled: bool,
    /// Response content types that are metered (compared without parameters, case-insensitive).
    pub content_types: Vec<String>,
    /// A gap longer than this is a stall.
    pub stall_threshold: Duration,
    /// Bound on the partial event a scanner carries.
    pub max_event_bytes: usize,
    /// Bound on bytes waiting between the ingress reader and the egress body.
    pub buffer_bytes: usize,
    /// Bound on frames waiting between the ingress reader and the egress body.
    pub buffer_frames: usize,
    /// Response header carrying the stream ID; `None` when turned off.
    pub stream_id_header: Option<http::HeaderName>,
    /// The longest non-streaming JSON response whose usage is read into the token counters
    /// (a copy of it is kept while it is forwarded); a longer one is forwarded untouched and
    /// not read. 0 reads none.
    pub max_usage_body_bytes: usize,
}

/// How the proxy listener's connections are spread over threads (`server.threading`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threading {
    /// Each worker thread runs its own event loop and serves, start to end, the connections it
    /// accepts (and their upstream connections, from its own pool): a frame is read, metered and
    /// written on one thread with no cross-thread wake-up. The right choice when clients open
    /// many connections (HTTP/1.1, the usual case); one HTTP/2 connection is served by one thread.
    PerCore,
    /// One work-stealing pool serves every connection: tasks move to idle threads. For few client
    /// connections carrying many streams (HTTP/2 from an edge proxy), at more CPU per frame.
    Shared,
}

// === impl Threading ===

impl Threading {
    /// The value as `server.threading` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Threading::PerCore => "per_core",
            Threading::Shared => "shared",
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "per_core" => Ok(Threading::PerCore),
            "shared" => Ok(Threading::Shared),
            other => Err(format!("`{other}` is not one of per_core, shared")),
        }
    }
}

/// More proxy threads than this is a typo, not a machine.
const MAX_WORKERS: u64 = 1024;

impl Default for Config {
    fn default() -> Self {
        // The defaults are valid by construction (tested below).
        match validate(RawConfig::default()) {
            Ok(config) => config,
            Err(e) => panic!("built-in defaults are invalid: {e}"),
        }
    }
}

// === impl Config ===

impl Config {
    /// The number of proxy threads: `server.workers`, or one per CPU this process may use (its
    /// CPU affinity and cgroup quota, as the standard library reads them).
    pub fn worker_threads(&self) -> usize {
        self.server
            .workers
            .map(std::num::NonZeroUsize::get)
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            })
    }

    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let (raw, mut problems) = parse_raw(text);
        match validate(raw) {
            Ok(config) if problems.is_empty() => Ok(config),
            Ok(_) => Err(ConfigError(problems)),
            Err(more) => {
                problems.extend(more.located_in(text).0);
                Err(ConfigError(problems))
            }
        }
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::one("(file)", format!("cannot read {}: {e}", path.display()))
        })?;
        Self::from_toml(&text)
    }

    /// The configuration for `serve`: the file if given, then the flag and environment overrides.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        Self::from_args_with_text(args).map(|(config, _)| config)
    }

    /// [`Config::from_args`], with the file's text as it was read (`None` without a file), so a
    /// reload can tell a key the file writes from one it leaves to its default.
    pub fn from_args_with_text(args: &ServeArgs) -> Result<(Self, Option<String>), ConfigError> {
        let mut text = None;
        let mut raw = match &args.config {
            Some(path) => {
                let read = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::one("--config", format!("cannot read {}: {e}", path.display()))
                })?;
                let (raw, problems) = parse_raw(&read);
                if !problems.is_empty() {
                    return Err(ConfigError(problems));
                }
                text = Some(read);
                raw
            }
            None => RawConfig::default(),
        };
        // Each override: the file's key, the flag, its environment variable, and the value.
        let overrides = [
            (
                "server.listen",
                "--listen",
                "METRONOME_LISTEN",
                &args.listen,
            ),
            (
                "server.upstream",
                "--upstream",
                "METRONOME_UPSTREAM",
                &args.upstream,
            ),
            ("server.admin", "--admin", "METRONOME_ADMIN", &args.admin),
            (
                "metering.stall_threshold",
                "--stall-threshold",
                "METRONOME_STALL_THRESHOLD",
                &args.stall_threshold,
            ),
            (
                "tls.cert",
                "--tls-cert",
                "METRONOME_TLS_CERT",
                &args.tls_cert,
            ),
            ("tls.key", "--tls-key", "METRONOME_TLS_KEY", &args.tls_key),
        ];
        let fields = [
            &mut raw.server.listen,
            &mut raw.server.upstream,
            &mut raw.server.admin,
            &mut raw.metering.stall_threshold,
            &mut raw.tls.cert,
            &mut raw.tls.key,
        ];
        for (field, (_, _, _, value)) in fields.into_iter().zip(&overrides) {
            if let Some(v) = value {
                *field = v.clone();
            }
        }
        match validate(raw) {
            Ok(config) => Ok((config, text)),
            Err(e) => {
                // A problem with a value from a flag or variable names where it came from, not
                // a file key the file may not even have; the rest get their line in the file.
                let e = e.named_by(&overrides);
                Err(match &text {
                    Some(text) => e.located_in(text),
                    None => e,
                })
            }
        }
    }
}

/// The most TOML and type problems one run reports (each costs a parse of the file).
const MAX_PARSE_PROBLEMS: usize = 64;

/// Parses TOML text into the raw configuration like a linter: every syntax, type and unknown-key
/// problem with its key path, line and column, all of them in one run. After each problem the
/// lines it spans (a whole table, for a table header) are blanked, offsets kept, and the parse
/// runs again; what is left parses into a [`RawConfig`] that `validate` checks for the rest.
fn parse_raw(text: &str) -> (RawConfig, Vec<ConfigProblem>) {
    let mut problems = Vec::new();
    let mut text = text.to_string();
    while problems.len() < MAX_PARSE_PROBLEMS {
        let error = match serde_path_to_error::deserialize(toml::Deserializer::new(&text)) {
            Ok(raw) => return (raw, problems),
            Err(e) => e,
        };
        let path = error.path().to_string();
        let inner = error.into_inner();
        problems.push(toml_problem(&inner, &path, &text));
        let blanked = inner.span().map(|span| blank_lines(&text, span));
        match blanked {
            Some(next) if next != text => text = next,
            _ => break,
        }
    }
    (RawConfig::default(), problems)
}

/// One TOML or type problem: the key path where serde was, and the toml crate's message with
/// the line and column (1-based) it points at.
fn toml_problem(e: &toml::de::Error, path: &str, text: &str) -> ConfigProblem {
    let mut message = e.message().trim().to_string();
    if message.is_empty() {
        // The toml crate gives no message for some characters (a control character in a
        // comment): name the character, so the reason is never empty.
        let found = e
            .span()
            .and_then(|span| text.get(span.start..))
            .and_then(|rest| rest.chars().next());
        message = match found {
            Some(c) => format!("unexpected character {c:?} (U+{:04X})", u32::from(c)),
            None => "this is not valid TOML".to_string(),
        };
    }
    let reason = match e.span() {
        Some(span) => {
            let (line, column) = line_and_column(text, span.start);
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    };
    let key = if path.is_empty() || path == "." {
        "(file)".to_string()
    } else {
        path.to_string()
    };
    ConfigProblem { key, reason }
}

/// The 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// `text` with the lines that `span` touches turned into spaces (newlines and byte offsets
/// kept); when the first is a table header, the table's lines up to the next header too.
fn blank_lines(text: &str, span: std::ops::Range<usize>) -> String {
    let line_start = |at: usize| {
        text.get(..at)
            .and_then(|t| t.rfind('\n'))
            .map_or(0, |i| i + 1)
    };
    let line_end = |at: usize| {
        text.get(at..)
            .and_then(|t| t.find('\n'))
            .map_or(text.len(), |i| at + i)
    };
    let start = line_start(span.start.min(text.len()));
    let mut end = line_end(
        span.end
            .max(span.start + 1)
            .saturating_sub(1)
            .min(text.len()),
    );
    let header = text
        .get(start..)
        .is_some_and(|t| t.trim_start().starts_with('['));
    if header {
        while end < text.len() {
            let next = end + 1;
            let next_end = line_end(next);
            if text
                .get(next..next_end)
                .is_some_and(|l| l.trim_start().starts_with('['))
            {
                break;
            }
            end = next_end;
        }
    }
    let mut bytes = text.as_bytes().to_vec();
    for b in bytes.iter_mut().take(end).skip(start) {
        if *b != b'\n' && *b != b'\r' {
            *b = b' ';
        }
    }
    // Only ASCII bytes of whole lines changed: the result is still UTF-8.
    String::from_utf8(bytes).unwrap_or_default()
}

/// The longest duration a key may take: far beyond any sensible timeout, far below what would
/// overflow a deadline.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest `metrics.flush_interval`: past an hour a stream's figures are as late as if they
/// were published at its end.
const MAX_FLUSH_INTERVAL: Duration = Duration::from_secs(3600);

/// The values a route's `format` key accepts, for problem messages.
fn format_names() -> String {
    let mut names = vec!["auto"];
    names.extend(
        Format::ALL
            .into_iter()
            .filter(|f| *f != Format::Unknown)
            .map(Format::name),
    );
    names.join(", ")
}

fn check_bounds(bounds: &[f64]) -> Result<(), String> {
    if bounds.is_empty() {
        return Err("must list at least one bucket bound".into());
    }
    if bounds.len() > MAX_BOUNDS {
        return Err(format!("{} bounds, at most {MAX_BOUNDS}", bounds.len()));
    }
    if bounds.iter().any(|b| !b.is_finite() || *b < 0.0) {
        return Err("bounds must be finite and not negative".into());
    }
    if bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err("bounds must increase strictly".into());
    }
    Ok(())
}

/// Just enough content-type syntax to check a `type/subtype`.
mod mime_like {
    /// `type/subtype` without parameters.
    pub struct Essence;

    impl std::str::FromStr for Essence {
        type Err = ();
        fn from_str(s: &str) -> Result<Self, ()> {
            let token = |t: &str| {
                !t.is_empty()
                    && t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
            };
            match s.trim().split_once('/') {
                Some((a, b)) if token(a) && token(b) => Ok(Essence),
                _ => Err(()),
            }
        }
    }
}

/// `metronome check-config FILE`: prints OK and a summary, or every problem; exit 0 or 2.
pub fn check_config_command(file: &Path) -> ExitCode {
    match Config::load(file) {
        Ok(config) => {
            println!("OK: {}", file.display());
            println!("  proxy listener  {}", config.server.listen);
            println!("  admin listener  {}", config.server.admin);
            println!("  default upstream {}", config.server.upstream);
            for route in &config.routes {
                println!(
                    "  route {:<16} {} {:?} {} -> {} (format {})",
                    route.name,
                    route.method.as_ref().map(|m| m.as_str()).unwrap_or("*"),
                    route.match_kind,
                    route.path,
                    route.upstream,
                    route.format.map_or("auto", Format::name)
                );
            }
            println!("  requests that match no route go to route `other`");
            let r = &config.readiness;
            match (&r.path, r.check_upstream) {
                (_, false) => println!("  /readyz          not draining (upstream not checked)"),
                (None, true) => println!(
                    "  /readyz          not draining and a TCP connection to the upstream opens (every {:?}, {:?} timeout)",
                    r.interval, r.timeout
                ),
                (Some(path), true) => println!(
                    "  /readyz          not draining and GET {path} on the upstream answers 2xx (every {:?}, {:?} timeout)",
                    r.interval, r.timeout
                ),
            }
            ExitCode::SUCCESS
        }
        Err(ConfigError(problems)) => {
            eprintln!("{}: {} problem(s)", file.display(), problems.len());
            for p in problems {
                eprintln!("  {p}");
            }
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = Config::default();
        assert_eq!(config.server.listen.port(), 8080);
        assert_eq!(config.server.admin.port(), 9464);
        // The unauthenticated admin listener is private unless configured otherwise,
        // and frame sizes (a token-length side channel) are opt-in.
        assert!(
            config.server.admin.ip().is_loopback(),
            "{}",
            config.server.admin
        );
        assert!(!config.timeline.frame_sizes);
        assert_eq!(config.timeouts.sniff, Duration::from_secs(5));
        assert_eq!(config.metering.stall_threshold, Duration::from_millis(200));
        assert_eq!(config.buckets, Buckets::default());
    }

    #[test]
    fn the_admin_listeners_bounds_default_apart_and_are_checked_at_their_lines() {
        let admin = Config::default().admin;
        assert_eq!(admin.max_connections, 128);
        assert_eq!(admin.head_timeout, Duration::from_secs(10));
        assert_eq!(admin.idle_timeout, Duration::from_secs(60));
        assert_eq!(admin.max_header_bytes, 16 * 1024);
        let text = "[admin]\nmax_connections = 0\nhead_timeout = \"0s\"\nidle_timeout = \"soon\"\nmax_header_bytes = 100\n";
        let problems = Config::from_toml(text).unwrap_err().0;
        let found: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.key.as_str(), &p.reason[..7]))
            .collect();
        assert_eq!(
            found,
            [
                ("admin.head_timeout", "line 3,"),
                ("admin.idle_timeout", "line 4,"),
                ("admin.max_connections", "line 2,"),
                ("admin.max_header_bytes", "line 5,"),
            ]
        );
    }

    #[test]
    fn an_allowed_model_that_could_never_be_a_label_is_refused_at_its_line() {
        let text = "[models]\nallow = [\"llama\", \"other\", \"gpt\\u202e4\"]\n";
        let problems = Config::from_toml(text).unwrap_err().0;
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["models.allow[1]", "models.allow[2]"]);
        assert!(
            problems[0].reason.starts_with("line 2, column"),
            "{problems:?}"
        );
        assert!(problems[1].reason.contains("\\u{202e}"), "{problems:?}");
    }

    #[test]
    fn the_documented_example_is_valid() {
        let text = include_str!("../config/metronome.toml");
        let config = Config::from_toml(text).unwrap();
        assert!(!config.routes.is_empty());
    }

    #[test]
    fn the_kubernetes_sidecar_config_is_valid() {
        let text = include_str!("../deploy/kubernetes/base/metronome.toml");
        let config = Config::from_toml(text).unwrap();
        assert_eq!(config.server.upstream.to_string(), "http://127.0.0.1:8000");
        assert_eq!(config.readiness.path.unwrap().as_str(), "/health");
        // terminationGracePeriodSeconds (330) covers the preStop sleep (10 s) and the drain.
        assert!(config.server.drain_grace + Duration::from_secs(10) < Duration::from_secs(330));
    }

    #[test]
    fn a_toml_error_always_has_a_reason() {
        // Found by fuzzing: toml's message is empty for a control character in a comment.
        let e = Config::from_toml("# a comment \u{1b} with ESC\n").unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert_eq!(e.0[0].key, "(file)");
        assert_eq!(
            e.0[0].reason,
            "line 1, column 13: unexpected character '\\u{1b}' (U+001B)"
        );
    }

    #[test]
    fn absurd_durations_are_refused_not_panicked_on() {
        // Found by inspection while writing the config fuzz target: 1e20 s does not fit a
        // Duration (it panicked), and 1e19 s fits but overflows `Instant::now() + idle`.
        for (text, reason) in [
            (
                "99999999999999999999s",
                "`99999999999999999999s` is too long",
            ),
            (
                "10000000000000000000s",
                "`10000000000000000000s` is longer than a year",
            ),
        ] {
            let e = Config::from_toml(&format!("[timeouts]\nidle = \"{text}\"\n")).unwrap_err();
            assert_eq!(e.0.len(), 1);
            assert_eq!(e.0[0].key, "timeouts.idle");
            // Validation's problems name the line and column of the value, as parse problems do.
            assert_eq!(e.0[0].reason, format!("line 2, column 8: {reason}"));
        }
        assert!(Config::from_toml("[timeouts]\nidle = \"8760h\"\n").is_ok());
    }

    #[test]
    fn threads_default_to_one_event_loop_per_cpu_and_are_checked() {
        let config = Config::default();
        assert_eq!(config.server.threading, Threading::PerCore);
        assert_eq!(
            config.server.http1_server,
            crate::config::ServerKind::Native
        );
        assert_eq!(config.server.workers, None);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(config.worker_threads(), cpus);

        let config = Config::from_toml("[server]\nworkers = 3\nthreading = \"shared\"\n").unwrap();
        assert_eq!(config.server.threading, Threading::Shared);
        assert_eq!(config.worker_threads(), 3);

        let e =
            Config::from_toml("[server]\nworkers = 5000\nthreading = \"per-core\"\n").unwrap_err();
        let problems: Vec<_> =
            e.0.iter()
                .map(|p| (p.key.as_str(), p.reason.as_str()))
                .collect();
        assert_eq!(
            problems,
            [
                (
                    "server.threading",
                    "line 3, column 13: `per-core` is not one of per_core, shared"
                ),
                (
                    "server.workers",
                    "line 2, column 11: 5000 is more than 1024; 0 means one per CPU"
                ),
            ]
        );
    }

    #[test]
    fn every_toml_and_type_problem_comes_in_one_run_with_line_column_and_key() {
        let text = "[server]\nlisten = 8080\ncolour = \"red\"\n\n[nosuch]\na = 1\n\n\
                    [metering]\nstall_threshold = \"5 parsecs\"\n\n[[routes]]\nname = \"chat\"\n\
                    path = \"/v1/chat/completions\"\nupstream = 5\n";
        let problems = Config::from_toml(text).unwrap_err().0;
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 5, "{lines:#?}");
        assert!(
            lines[0].starts_with("server.listen: line 2, column 10: invalid type"),
            "{lines:#?}"
        );
        assert!(
            lines[1].starts_with("server.colour: line 3, column 1: unknown field"),
            "{lines:#?}"
        );
        assert!(
            lines[2].starts_with("nosuch: line 5, column 2: unknown field"),
            "{lines:#?}"
        );
        assert!(
            lines[3].starts_with("routes[0].upstream: line 14, column 12: invalid type"),
            "{lines:#?}"
        );
        assert!(
            lines[4].starts_with("metering.stall_threshold: "),
            "{lines:#?}"
        );
    }

    #[test]
    fn a_syntax_error_has_its_line_and_column_and_later_ones_still_come() {
        let problems =
            Config::from_toml("[server\nlisten = \"x\"\n[limits]\nmax_requests = \"many\"\n")
                .unwrap_err()
                .0;
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert_eq!(problems[0].key, "(file)");
        assert!(
            problems[0].reason.starts_with("line 1, column 8: "),
            "{problems:#?}"
        );
        assert_eq!(problems[1].key, "limits.max_requests");
        assert!(
            problems[1]
                .reason
                .starts_with("line 4, column 16: invalid type"),
            "{problems:#?}"
        );
    }

    #[test]
    fn durations_take_the_go_and_kubernetes_spelling() {
        let config = Config::from_toml("[server]\ndrain_grace = \"1m30s\"\n").unwrap();
        assert_eq!(config.server.drain_grace, Duration::from_secs(90));
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = Config::from_toml("[server]\nlisten = \"0.0.0.0:1\"\nlisen = 1\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `lisen`"), "{err}");
    }

    #[test]
    fn every_problem_is_named_by_its_key() {
        let text = r#"
[server]
listen = "nowhere"
upstream = "ftp://x"
upstream_client = "curl"
http1_server = "apache"
[timeouts]
idle = "5"
upstream_idle = "0s"
[metering]
buffer_bytes = 10
[buckets]
itl = [0.1, 0.05]
[[routes]]
name = "chat"
path = "v1/chat"
match = "glob"
[[routes]]
name = "chat"
path = "/x"
method = "G T"
format = "vllm"
"#;
        let ConfigError(problems) = Config::from_toml(text).unwrap_err();
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        for key in [
            "server.listen",
            "server.upstream",
            "server.upstream_client",
            "server.http1_server",
            "timeouts.idle",
            "timeouts.upstream_idle",
            "metering.buffer_bytes",
            "buckets.itl",
            "routes[0].path",
            "routes[0].match",
            "routes[1].name",
            "routes[1].method",
            "routes[1].format",
        ] {
            assert!(keys.contains(&key), "missing {key} in {keys:?}");
        }
    }

    #[test]
    fn a_route_format_is_auto_by_default_or_one_of_the_apis() {
        let text = r#"
[[routes]]
name = "tgi"
path = "/generate_stream"
format = "tgi"
[[routes]]
name = "any"
path = "/"
format = "auto"
[[routes]]
name = "default"
path = "/d"
"#;
        let config = Config::from_toml(text).unwrap();
        let formats: Vec<_> = config.routes.iter().map(|r| r.format).collect();
        assert_eq!(formats, vec![Some(Format::Tgi), None, None]);
        let ConfigError(problems) =
            Config::from_toml("[[routes]]\nname = \"x\"\npath = \"/\"\nformat = \"unknown\"\n")
                .unwrap_err();
        assert_eq!(problems[0].key, "routes[0].format");
        assert!(
            problems[0].reason.contains(
                "auto, openai, tgi, llamacpp, sglang, ollama, responses, anthropic, gemini"
            ),
            "{}",
            problems[0].reason
        );
    }

    #[test]
    fn batch_defaults_and_its_keys_are_validated() {
        assert_eq!(Config::default().batch, BatchSettings::default());
        let config = Config::from_toml(
            "[batch]\nenabled = false\ngap_ratio = 3.0\nmin_gap = \"10ms\"\nmin_streams = 4\nmin_share = 0.25\nlookback = \"5s\"\n",
        )
        .unwrap();
        let b = config.batch;
        assert!(!b.enabled);
        assert_eq!((b.gap_ratio, b.min_streams, b.min_share), (3.0, 4, 0.25));
        assert_eq!(
            (b.min_gap, b.lookback),
            (Duration::from_millis(10), Duration::from_secs(5))
        );
        for (text, key) in [
            ("[batch]\ngap_ratio = 0.5\n", "batch.gap_ratio"),
            ("[batch]\nmin_gap = \"soon\"\n", "batch.min_gap"),
            ("[batch]\nmin_streams = 0\n", "batch.min_streams"),
            ("[batch]\nmin_share = 1.5\n", "batch.min_share"),
            ("[batch]\nmin_share = 0.0\n", "batch.min_share"),
            ("[batch]\nfalse_positive = 0.0\n", "batch.false_positive"),
            ("[batch]\nfalse_positive = 2.0\n", "batch.false_positive"),
            ("[batch]\nrate_window = \"10ms\"\n", "batch.rate_window"),
            ("[batch]\nlookback = \"2 parsecs\"\n", "batch.lookback"),
            ("[batch]\nwindow = 3\n", "batch.window"),
        ] {
            let ConfigError(problems) = Config::from_toml(text).unwrap_err();
            assert_eq!(problems.len(), 1, "{text}: {problems:?}");
            assert!(problems[0].key.starts_with(key), "{text}: {problems:?}");
        }
    }

    #[test]
    fn readiness_defaults_to_a_tcp_check_and_its_keys_are_validated() {
        let r = Config::default().readiness;
        assert!(r.check_upstream);
        assert_eq!(r.path, None);
        assert_eq!(r.interval, Duration::from_secs(5));
        let config = Config::from_toml(
            "[readiness]\npath = \"/health\"\ninterval = \"1s\"\ntimeout = \"500ms\"\n",
        )
        .unwrap();
        assert_eq!(config.readiness.path.unwrap().as_str(), "/health");
        for (text, key) in [
            ("[readiness]\npath = \"health\"\n", "readiness.path"),
            ("[readiness]\ninterval = \"0s\"\n", "readiness.interval"),
            (
                "[readiness]\ninterval = \"1s\"\ntimeout = \"2s\"\n",
                "readiness.timeout",
            ),
        ] {
            let ConfigError(problems) = Config::from_toml(text).unwrap_err();
            assert_eq!(problems[0].key, key, "{text}");
        }
    }

    #[test]
    fn an_upstream_url_with_credentials_is_refused_without_echoing_them() {
        let err = Upstream::parse("http://user:hunter2@10.0.0.1:8000").unwrap_err();
        assert!(err.contains("credentials"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn overrides_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:1111\"\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            listen: Some("127.0.0.1:2222".into()),
            upstream: Some("http://10.0.0.1:9000/base/".into()),
            ..ServeArgs::default()
        };
        let config = Config::from_args(&args).unwrap();
        assert_eq!(config.server.listen.port(), 2222);
        assert_eq!(config.server.upstream.base_path, "/base");
    }

    // --- [metrics] ---

    #[test]
    fn metrics_native_defaults_and_bad_values_named_by_key() {
        let config = Config::from_toml("").unwrap();
        let native = config.metrics.native;
        assert!(native.enabled);
        assert_eq!((native.schema, native.max_buckets), (4, 160));
        assert_eq!(native.zero_threshold, 2f64.powi(-128));
        for (text, key) in [
            ("[metrics.native]\nschema = 9", "metrics.native.schema"),
            ("[metrics.native]\nschema = -5", "metrics.native.schema"),
            (
                "[metrics.native]\nzero_threshold = -1.0",
                "metrics.native.zero_threshold",
            ),
            (
                "[metrics.native]\nmax_buckets = 0",
                "metrics.native.max_buckets",
            ),
        ] {
            let ConfigError(problems) = Config::from_toml(text).unwrap_err();
            assert_eq!(problems[0].key, key, "{text}");
        }
        assert!(Config::from_toml("[metrics]\nclassic = \"coarse\"").is_err());
    }

    #[test]
    fn the_fine_classic_preset_replaces_only_default_lists() {
        let config = Config::from_toml("[metrics]\nclassic = \"fine\"").unwrap();
        assert_eq!(config.buckets, Buckets::fine());
        let text = "[metrics]\nclassic = \"fine\"\n[buckets]\nitl = [0.01, 0.1]";
        let config = Config::from_toml(text).unwrap();
        assert_eq!(
            config.buckets.itl,
            vec![0.01, 0.1],
            "a list of one's own stays"
        );
        assert_eq!(config.buckets.ttft, Buckets::fine().ttft);
        for list in [
            &Buckets::fine().ttft,
            &Buckets::fine().itl,
            &Buckets::fine().proxy_delay,
            &Buckets::fine().stall_duration,
        ] {
            assert!(check_bounds(list).is_ok());
        }
        assert_eq!(Config::from_toml("").unwrap().buckets, Buckets::default());
    }
}
