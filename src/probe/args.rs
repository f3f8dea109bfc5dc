//! The probe's command line ([`ProbeArgs`]) and the validated settings a measurement runs from
//! ([`ProbeConfig`]). The library API (the demo) builds a [`ProbeConfig`] directly; the command
//! line goes through `TryFrom<&ProbeArgs>`, which is where every usage error is caught, before a
//! single request is sent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::Uri;

use super::secrets::{ApiKey, Secrets};
use super::workload::{chat_request, read_dataset, synthetic_prompt, OutputLength, RequestShape};
use super::ws_protocol::{RealtimeAsk, WsProtocol};
use crate::format::{ThinkSettings, ThinkStart, ThinkTags};
use crate::units::parse_duration;

/// The response header that carries the proxy's stream ID, joined later with its timeline.
pub const STREAM_ID_HEADER: &str = "x-metronome-stream-id";

/// The user message of the default chat request.
pub const DEFAULT_PROMPT: &str = "Write a short story about a metronome.";

/// The path used when `--url` names only a host: the OpenAI chat endpoint.
pub const DEFAULT_PATH: &str = "/v1/chat/completions";

/// The `User-Agent` of every request, so a server's log tells the probe's load from users'.
pub const USER_AGENT_VALUE: &str = concat!("metronome-probe/", env!("CARGO_PKG_VERSION"));

/// Command-line arguments of `metronome probe`, grouped by concern (the groups are the sections
/// of `--help`). The larger groups are boxed so the binary's subcommand enum stays small.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = AFTER_HELP)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ProbeArgs {
    /// `metronome probe compare A.json B.json`: no run, two reports side by side.
    #[command(subcommand)]
    pub command: Option<ProbeCommand>,

    /// URL to stream from (POST), `http://` or `https://`. A URL without a path gets
    /// `/v1/chat/completions`. A `ws://` or `wss://` URL (or `--websocket`) streams over a
    /// WebSocket instead.
    #[arg(long, required = true)]
    pub url: Option<String>,

    /// How many streams, how fast.
    #[command(flatten)]
    pub load: LoadArgs,

    /// What each request sends.
    #[command(flatten)]
    pub request: Box<RequestArgs>,

    /// What is reported and gated.
    #[command(flatten)]
    pub output: Box<OutputArgs>,
}

/// What `metronome probe` does instead of a run.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ProbeCommand {
    /// Print two earlier `--json` reports side by side with their deltas (B against A).
    Compare {
        /// The earlier report (the baseline).
        a: PathBuf,
        /// The later report.
        b: PathBuf,
    },
}

/// How many streams the probe runs, how fast, and how long each may take.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Load")]
pub struct LoadArgs {
    /// Streams in flight at once. Closed loop (default): exactly this many, each starting the next
    /// stream when it ends (default 1). Open loop (`--rate`): a cap on streams in flight (default
    /// no cap); a start held back by the cap still counts its latency from its intended time.
    #[arg(long, short = 'c')]
    pub concurrency: Option<usize>,

    /// Number of streams to run (default 10).
    #[arg(long, short = 'n', conflicts_with = "duration")]
    pub requests: Option<u64>,

    /// Start streams for this long instead of a fixed number (e.g. `30s`); streams in flight at
    /// the end are finished.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Open loop: start this many streams per second at fixed intended times, whatever the
    /// server's pace. TTFT is measured from the intended start, so queueing is not hidden.
    #[arg(long, conflicts_with = "rate_sweep")]
    pub rate: Option<f64>,

    /// One open-loop run per rate (streams per second), e.g. `1,2,4,8`, and one report with a
    /// row per rate: at what load does it start to stutter? Each run follows `--requests` or
    /// `--duration`; gates apply to every rate.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["html", "detail", "join", "baseline"])]
    pub rate_sweep: Vec<f64>,

    /// Give up on a stream after this long (from sending it to its last byte).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Speak HTTP/2 (prior knowledge on http://, ALPN `h2` on https://): every stream shares one
    /// connection, so thousands of streams need no more than a few sockets.
    #[arg(long)]
    pub http2: bool,

    /// For an https:// URL: trust the CA certificates in this PEM file instead of the system's
    /// roots (a private CA, a test certificate).
    #[arg(long, value_name = "PEM")]
    pub cacert: Option<PathBuf>,
}

/// The request every stream sends.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Request")]
pub struct RequestArgs {
    /// The `model` of the default chat request. Without it, the probe asks the server's
    /// `GET /v1/models` and uses the first model listed (and says so).
    #[arg(long)]
    pub model: Option<String>,

    /// The user message of the default chat request.
    #[arg(long, default_value = DEFAULT_PROMPT)]
    pub prompt: String,

    /// The `max_tokens` of the default chat request.
    #[arg(long, default_value_t = 64, conflicts_with = "output_tokens")]
    pub max_tokens: u32,

    /// Ask for exactly this many output tokens: `max_tokens` and `ignore_eos: true` (as vllm
    /// bench does; vLLM and SGLang honour it, other servers ignore or refuse it: see
    /// `--no-ignore-eos`).
    #[arg(long, value_name = "N")]
    pub output_tokens: Option<u32>,

    /// With `--output-tokens`: do not send `ignore_eos` (for servers that refuse unknown fields).
    #[arg(long, requires = "output_tokens")]
    pub no_ignore_eos: bool,

    /// A synthetic prompt of about N tokens (common one-token English words) instead of
    /// `--prompt`.
    #[arg(long, value_name = "N", conflicts_with = "prompt")]
    pub input_tokens: Option<u32>,

    /// One request per line, in order (or at random with `--seed`): a JSON object is a request
    /// body (its `model` filled in when missing, `stream` set), anything else a prompt.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with = "body")]
    pub dataset: Option<PathBuf>,

    /// Sample `--dataset` lines at random (with replacement) from this seed instead of in order.
    #[arg(long, requires = "dataset")]
    pub seed: Option<u64>,

    /// Send this file as the request body instead of the default chat request.
    #[arg(long)]
    pub body: Option<PathBuf>,

    /// An extra request header, `'Name: value'` (repeatable). One of the same name replaces the
    /// probe's own (`User-Agent`, `Content-Type`, the `Authorization` of `--api-key`).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,

    /// Stream over a WebSocket: the Responses API's WebSocket mode (`responses`, a
    /// `response.create` per response) or the Realtime API (`realtime`); without a value, the
    /// URL's path tells (`/v1/responses`, `/v1/realtime`). TTFT counts from sending the
    /// `response.create`.
    #[arg(
        long,
        value_enum,
        num_args = 0..=1,
        default_missing_value = "auto",
        value_name = "API",
        help_heading = "WebSocket"
    )]
    pub websocket: Option<WsChoice>,

    /// Responses each WebSocket carries, one after another, before the probe opens a new one
    /// (closed loop only).
    #[arg(
        long,
        default_value_t = 1,
        value_name = "K",
        help_heading = "WebSocket"
    )]
    pub responses_per_socket: u64,

    /// Realtime API: ask for spoken responses (audio and its transcript) or text.
    #[arg(long, value_enum, default_value_t = RealtimeOutput::Audio, help_heading = "WebSocket")]
    pub realtime_output: RealtimeOutput,

    /// An API key, sent as `Authorization: Bearer KEY` with every request and to `/v1/models`
    /// (as vLLM's `--api-key` and OpenAI's API expect). It is never printed nor written to a
    /// report, and whatever a server echoes of it is masked.
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<ApiKey>,
}

/// `--websocket`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WsChoice {
    /// The API the URL's path names.
    Auto,
    /// The Responses API's WebSocket mode.
    Responses,
    /// The Realtime API.
    Realtime,
}

/// `--realtime-output`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RealtimeOutput {
    /// Spoken responses: transcript and audio deltas.
    Audio,
    /// Text responses.
    Text,
}

/// How a run streams over a WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsSettings {
    /// The API spoken.
    pub protocol: WsProtocol,
    /// Responses per socket (at least 1).
    pub per_socket: u64,
    /// How the Realtime API's responses are asked for.
    pub realtime: RealtimeAsk,
}

/// The report: thresholds, files and gates.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Report")]
pub struct OutputArgs {
    /// A gap longer than this is a stall.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub stall_threshold: Duration,

    /// The tags a model served without a reasoning parser writes its thinking between (a
    /// route's `think_tags`): content that begins with OPEN is reasoning up to CLOSE, so TTFO
    /// counts to the first answer text after it. Each tag 1 to 64 bytes.
    #[arg(
        long,
        value_name = "OPEN,CLOSE",
        default_value = "<think>,</think>",
        value_parser = parse_think_tags
    )]
    pub think_tags: Arc<ThinkTags>,

    /// The chat template opens the thinking in the prompt (a route's `think_starts_open`):
    /// every stream's content is reasoning up to the closing tag.
    #[arg(long)]
    pub think_starts_open: bool,

    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Write a self-contained HTML report (gap histogram, cadence strips) to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,

    /// Write the figures beyond the JSON contract to this file as JSON: ITL and TTFT at p50, p99,
    /// p99.9 and max in microseconds, token events, gaps and errors by kind (for benchmarks).
    #[arg(long, value_name = "FILE")]
    pub detail: Option<PathBuf>,

    /// A gate such as `itl_p99<250ms`, `tps_p50>10`, `errors==0`, `goodput>=0.99` or
    /// `itl_p99<1.1*baseline` (repeatable, comma-separable). Any failed gate makes the exit
    /// code 1 and every report's headline FAIL.
    #[arg(long = "assert")]
    pub gates: Vec<String>,

    /// The run itself fails (exit 3) when more than this share (0-1) of the streams failed,
    /// whether or not gates are given. A run where no stream completed always fails.
    #[arg(long, default_value_t = 0.05)]
    pub max_error_rate: f64,

    /// Off a terminal, print a progress line to stderr this often (`0` = never). On a
    /// terminal a progress bar is drawn instead.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,

    /// Service-level objectives per stream, e.g. `ttft<500ms,tpot<=50ms,itl_p99<100ms,stalls==0`
    /// (objectives: ttft tpot e2el itl_p99 itl_max stalls). `goodput` is the share of streams
    /// meeting every one; a failed stream meets none.
    #[arg(long)]
    pub slo: Option<String>,

    /// An earlier `--json` report: prints the deltas and lets gates name it
    /// (`--assert 'itl_p99<1.1*baseline'`).
    #[arg(long, value_name = "FILE.json")]
    pub baseline: Option<PathBuf>,

    /// Write a JUnit XML report (one test case per gate) to this file.
    #[arg(long, value_name = "FILE.xml")]
    pub junit: Option<PathBuf>,

    /// Write a Markdown summary to this file; when `GITHUB_STEP_SUMMARY` is set it is also
    /// appended there.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,

    /// After the run, fetch each stream's timeline from metronome's admin listener at this URL
    /// (e.g. http://127.0.0.1:9464) and split the client's gaps into generation, metronome and
    /// after metronome (the `attribution` section).
    #[arg(long, value_name = "ADMIN_URL")]
    pub join: Option<String>,

    /// With --join: write every matched gap to this file as CSV, one row per gap (stream, event,
    /// client arrival in µs from the run's start, the client gap and its generation, metronome
    /// and after-metronome parts in µs), for analyses the report does not make, such as which
    /// gaps were late together.
    #[arg(long, value_name = "FILE", requires = "join")]
    pub gaps_csv: Option<PathBuf>,
}

/// The definitions behind the numbers, shown by `metronome probe --help`.
const AFTER_HELP: &str = "\
Figures:
  TTFT         intended start -> first token event (open loop: the scheduled time, so queueing shows)
  ITL          every gap between consecutive token events, all streams pooled; token events that
               arrive in one frame have a gap of 0 (a clump, as the reader sees it)
  tokens/s     per stream: (output tokens - 1) / (last token event - first token event); output
               tokens from the server's usage if reported, else counted token events
  stall_pct    percentage of gaps longer than --stall-threshold
  stalled_streams_pct
               percentage of the streams (with a gap) that had at least one stall
  jank ratio   p99 gap / max(p50 gap, 1ms), pooled; per stream over streams with 8+ gaps
  verdict      what the readers felt, stream by stream: SMOOTH when at most 1% of the streams
               stalled (a gap over --stall-threshold), 95% of the streams with 8+ gaps keep their
               jank ratio under 4, and the median stream reads over 7 tokens/s; JANKY otherwise,
               and when there is no data to tell
Percentiles are nearest-rank on the exact samples. Figures without data are null in JSON, - in text.
Failed streams (connect, non-2xx, body error, timeout, no token event, error event) count in
`errors`; their token events still count in the timing figures.

Gates (--assert): tps_p50 tps_p5 itl_p50 itl_p95 itl_p99 itl_max ttft_p50 ttft_p95 ttft_p99
ttft_max jank stream_jank_p50 stream_jank_p95 stall_pct stalled_streams_pct errors goodput
goodput_rps rps output_tps; by phase (docs/design.md section 3): ttfo_p50 ttfo_p95 ttfo_p99
ttfo_max (time to first output token, the first that is not reasoning) and the gaps that end at
one phase's token events, itl_reasoning_p50 itl_reasoning_p95 itl_reasoning_p99
itl_reasoning_max itl_content_p50 itl_content_p95 itl_content_p99 itl_content_max
itl_tool_call_p50 itl_tool_call_p95 itl_tool_call_p99 itl_tool_call_max; with < <= > >= == (as
--slo); latencies take a unit (250ms, 2s), the others plain numbers. A gate without data fails.

Result: every report (text, --json, --junit, --markdown, --html) leads with the headline the exit
code is taken from: the verdict when every gate passed, FAIL when a gate failed, ERROR when the
run failed or never took place; each gate's expression, value and result; and a failed run's
cause (the server's status and the start of its body). Every exit path writes every report
asked for, also when no model could be found or a value of the command line is refused.

Failing servers. When the first 8 streams to end all failed, the run ends early (no more streams
start) and fails. After a failed stream a closed-loop worker waits before its next start: 10ms,
doubling with each failure in a row up to 1s, with jitter; none after a stream that completes.

Requests carry User-Agent: metronome-probe/VERSION, and with --api-key (or OPENAI_API_KEY)
Authorization: Bearer KEY; a --header of the same name replaces either.

Attribution (--join ADMIN_URL): each stream's timeline is fetched from metronome's admin
listener by its x-metronome-stream-id and matched event by event (the k-th token event at the
client is the k-th in the timeline). Clocks are not shared: per stream, the smallest client-minus-
egress time is the base delay. Each client gap G at p50/p95/p99 is split into generation (the
ingress gap of the same two events), metronome (the change in egress - ingress) and after
metronome (the rest, G - generation - metronome): a buffering edge shows as a negative part in
clumps and a large positive part in the gap that releases them. Clumping compares events per
client read with events per upstream frame. Streams that cannot be joined are counted, never fatal.

Goodput (--slo): per stream, ttft (from the intended start), tpot ((e2el - ttft) / (output
tokens - 1), 0 for one token, as vllm bench serve computes it), e2el (intended start -> end of
the body), itl_p99, itl_max, stalls (gaps over --stall-threshold). goodput is the share of
streams meeting every objective; failed streams meet none. goodput_rps (good streams per second
of wall time) is what vllm bench serve --goodput reports.

Baselines (--baseline FILE.json): a gate's bound may be `baseline` or `F*baseline`, the same
metric in that report. `metronome probe compare A.json B.json` prints two reports side by side.
Both warn when the two runs' workloads differ (meta: load, concurrency, rate, and meta.workload:
output and input tokens, dataset, body, seed, HTTP/2, stall threshold).

Exit codes: 0 all gates pass, 1 a gate failed, 2 usage error or a report file cannot be written,
3 the run failed: no stream completed, more than --max-error-rate of them failed, or no model
could be found.";

/// When the probe stops starting streams.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this many streams.
    Requests(u64),
    /// After this long (measured from the start of the run); streams in flight are finished.
    After(Duration),
}

/// How streams are started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Each of `concurrency` workers starts its next stream when the previous one ends. The
    /// server's pace sets the start times, so latency is measured from the actual send.
    Closed {
        /// Streams in flight at once.
        concurrency: usize,
    },
    /// Streams start at fixed intended times, `rate` per second, and latency is measured from
    /// the intended time (no coordinated omission).
    Open {
        /// Streams started per second.
        rate: f64,
        /// At most this many in flight; a start held back waits, and the wait shows in its TTFT.
        max_in_flight: Option<usize>,
    },
}

/// Everything a measurement needs, validated. Fields are public so the demo can build one in code.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// Where every request is sent (POST).
    pub url: Uri,
    /// Closed or open loop.
    pub load: Load,
    /// When to stop starting streams.
    pub stop: Stop,
    /// The request body, sent unchanged with every request (unless `bodies` is not empty).
    pub body: Bytes,
    /// The `--dataset` bodies; stream `i` sends the one [`super::workload::pick`] chooses.
    /// Empty: every stream sends `body`.
    pub bodies: Vec<Bytes>,
    /// `--seed`: draw `bodies` at random instead of in order.
    pub seed: Option<u64>,
    /// The model asked for, for the report's metadata (`None` with `--body`).
    pub model: Option<String>,
    /// Request headers (a `content-type: application/json` unless the user gave another).
    pub headers: HeaderMap,
    /// Per-stream limit, from sending the request to the end of its body.
    pub timeout: Duration,
    /// HTTP/2 instead of HTTP/1.1 (prior knowledge on http://, ALPN on https://).
    pub http2: bool,
    /// The CA certificates (PEM) an https:// server's certificate must chain to; `None` for the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// A gap longer than this is a stall.
    pub stall_threshold: Duration,
    /// The response header whose value is kept as the stream's ID.
    pub stream_id_header: HeaderName,
    /// What each request asks for, as the report's `meta.workload` records it.
    pub shape: RequestShape,
    /// The credentials sent, masked in whatever the server answers before it is kept.
    pub secrets: Secrets,
    /// `--websocket`: stream over a WebSocket (`url` keeps its `http` or `https` scheme);
    /// `None` for HTTP streams.
    pub websocket: Option<WsSettings>,
    /// How content that carries the thinking inline is read (`--think-tags`,
    /// `--think-starts-open`), as the proxy reads a route's.
    pub think: ThinkSettings,
}

/// A usage error: the command line or the configuration asks for something the probe cannot do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--url` is not a URL.
    #[error("`{url}` is not a valid URL: {reason}")]
    InvalidUrl {
        /// What the user wrote.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The URL's scheme is neither http nor https.
    #[error("`{0}` is not supported: the probe speaks http:// and https://")]
    UnsupportedScheme(String),
    /// `--cacert` names no readable PEM file of certificates.
    #[error("--cacert: {0}")]
    InvalidCa(#[source] crate::tls::TlsError),
    /// `--cacert` was given for an http:// URL, where it would silently do nothing.
    #[error("--cacert applies to https:// URLs only")]
    CaWithoutTls,
    /// `--header` is not `Name: value`.
    #[error("`{0}` is not a header (write `Name: value`)")]
    InvalidHeader(String),
    /// `--body` could not be read.
    #[error("cannot read the request body from {path}: {source}")]
    UnreadableBody {
        /// The file named by `--body`.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// A count that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `--rate` is not a positive, finite number.
    #[error("--rate must be a positive number of streams per second, not {0}")]
    InvalidRate(f64),
    /// `--max-error-rate` is not a share between 0 and 1.
    #[error("--max-error-rate must be between 0 and 1, not {0}")]
    InvalidErrorRate(f64),
    /// `--api-key` cannot be a header value (a control character or a line break).
    #[error("--api-key (or OPENAI_API_KEY) holds a character a header cannot carry")]
    InvalidApiKey,
    /// No model was given or found (the caller resolves `--model` from `/v1/models` first).
    #[error("no model: give --model")]
    NoModel,
    /// `--dataset` cannot be used.
    #[error(transparent)]
    Dataset(#[from] super::workload::DatasetError),
    /// `--websocket` without an API, and a URL path that names none.
    #[error(
        "--websocket: `{0}` names neither API; give --websocket responses or --websocket realtime"
    )]
    WebSocketApi(String),
    /// A WebSocket setting that does not fit the rest of the command line.
    #[error("{0}")]
    WebSocket(&'static str),
}

// === impl ProbeConfig ===

impl ProbeConfig {
    /// A closed-loop probe of `url` with one stream at a time, ten streams, the default chat
    /// request for `model` and the default limits: the starting point for code that builds a
    /// config by hand. The URL follows the `--url` rules (http or https, the system's roots; no
    /// path means `/v1/chat/completions`).
    pub fn new(url: &str, model: &str) -> Result<Self, ConfigError> {
        let url = parse_url(url)?;
        Ok(ProbeConfig {
            url,
            load: Load::Closed { concurrency: 1 },
            stop: Stop::Requests(10),
            body: chat_body(model, DEFAULT_PROMPT, 64),
            bodies: Vec::new(),
            seed: None,
            model: Some(model.to_owned()),
            headers: default_headers(),
            timeout: Duration::from_secs(120),
            http2: false,
            ca: None,
            stall_threshold: Duration::from_millis(200),
            stream_id_header: HeaderName::from_static(STREAM_ID_HEADER),
            shape: RequestShape {
                max_tokens: Some(64),
                ..RequestShape::default()
            },
            secrets: Secrets::default(),
            websocket: None,
            think: ThinkSettings::default(),
        })
    }
}

/// How streams are started (closed or open loop) and when the run stops, from the load flags;
/// a rate that is not a positive number is a usage error.
fn load_and_stop(load_args: &LoadArgs) -> Result<(Load, Stop), ConfigError> {
    if let Some(rate) = load_args
        .rate_sweep
        .iter()
        .find(|r| !(r.is_finite() && **r > 0.0))
    {
        return Err(ConfigError::InvalidRate(*rate));
    }
    let load = match load_args.rate {
        None => Load::Closed {
            concurrency: positive(load_args.concurrency.unwrap_or(1), "--concurrency")?,
        },
        Some(rate) if rate.is_finite() && rate > 0.0 => Load::Open {
            rate,
            max_in_flight: load_args
                .concurrency
                .map(|c| positive(c, "--concurrency"))
                .transpose()?,
        },
        Some(rate) => return Err(ConfigError::InvalidRate(rate)),
    };
    let stop = match load_args.duration {
        Some(duration) => Stop::After(duration),
        None => Stop::Requests(load_args.requests.unwrap_or(10)),
    };
    Ok((load, stop))
}

impl TryFrom<&ProbeArgs> for ProbeConfig {
    type Error = ConfigError;

    fn try_from(args: &ProbeArgs) -> Result<Self, Self::Error> {
        let text = args.url.as_deref().unwrap_or_default();
        let (text, ws_scheme) = http_form(text);
        let url = parse_url(&text)?;
        let (load_args, request) = (&args.load, &*args.request);
        let max_error_rate = args.output.max_error_rate;
        if !(0.0..=1.0).contains(&max_error_rate) {
            return Err(ConfigError::InvalidErrorRate(max_error_rate));
        }
        let (load, stop) = load_and_stop(load_args)?;
        let output = OutputLength {
            max_tokens: request.output_tokens.unwrap_or(request.max_tokens),
            ignore_eos: request.output_tokens.is_some() && !request.no_ignore_eos,
        };
        let (body, bodies) = match &request.body {
            Some(path) => {
                let body = std::fs::read(path).map(Bytes::from).map_err(|source| {
                    ConfigError::UnreadableBody {
                        path: path.clone(),
                        source,
                    }
                })?;
                (body, Vec::new())
            }
            None => {
                let model = request.model.as_deref().ok_or(ConfigError::NoModel)?;
                let prompt = match request.input_tokens {
                    Some(n) => synthetic_prompt(n),
                    None => request.prompt.clone(),
                };
                let body = chat_request(model, &prompt, output);
                let bodies = match &request.dataset {
                    Some(path) => {
                        read_dataset(path, model, output, request.output_tokens.is_some())?
                    }
                    None => Vec::new(),
                };
                (body, bodies)
            }
        };
        let (headers, secrets) = request_headers(request)?;
        let websocket = websocket_settings(args, &url, &headers, ws_scheme)?;
        let ca = load_args.cacert.clone();
        if let Some(path) = &ca {
            if url.scheme_str() != Some("https") {
                return Err(ConfigError::CaWithoutTls);
            }
            // Read here only to refuse a bad file as a usage error (exit 2) before any stream
            // starts; the client reads it again when it is built, once per run.
            crate::tls::client_config(Some(path), None).map_err(ConfigError::InvalidCa)?;
        }
        Ok(ProbeConfig {
            url,
            load,
            stop,
            body,
            bodies,
            seed: request.seed,
            model: request
                .body
                .is_none()
                .then(|| request.model.clone())
                .flatten(),
            headers,
            timeout: load_args.timeout,
            http2: load_args.http2,
            ca,
            stall_threshold: args.output.stall_threshold,
            stream_id_header: HeaderName::from_static(STREAM_ID_HEADER),
            shape: RequestShape::of(request, output),
            secrets,
            websocket,
            think: ThinkSettings {
                tags: Some(args.output.think_tags.clone()),
                start: match args.output.think_starts_open {
                    true => ThinkStart::Open,
                    false => ThinkStart::Detect,
                },
            },
        })
    }
}

/// `--think-tags OPEN,CLOSE`: two tags split at the first comma, each as a route's
/// `think_tags` takes them.
fn parse_think_tags(text: &str) -> Result<Arc<ThinkTags>, String> {
    let (open, close) = text
        .split_once(',')
        .ok_or_else(|| format!("`{text}` is not OPEN,CLOSE (two tags and a comma)"))?;
    ThinkTags::new(open, close)
        .map(Arc::new)
        .ok_or_else(|| "each tag must be 1 to 64 bytes long".to_owned())
}

/// `text` with a `ws://` or `wss://` scheme written as `http://` or `https://`, and whether it
/// had one.
fn http_form(text: &str) -> (String, bool) {
    for (ws, http) in [("ws://", "http://"), ("wss://", "https://")] {
        if let Some(rest) = text.strip_prefix(ws) {
            return (format!("{http}{rest}"), true);
        }
    }
    (text.to_owned(), false)
}

/// The WebSocket settings of a run: with `--websocket` or a `ws://` URL, the API (named, or
/// the URL's path's) and how it is driven; `None` for HTTP streams.
fn websocket_settings(
    args: &ProbeArgs,
    url: &Uri,
    headers: &HeaderMap,
    ws_scheme: bool,
) -> Result<Option<WsSettings>, ConfigError> {
    let request = &*args.request;
    let choice = match (request.websocket, ws_scheme) {
        (Some(choice), _) => choice,
        (None, true) => WsChoice::Auto,
        (None, false) if request.responses_per_socket != 1 => {
            return Err(ConfigError::WebSocket(
                "--responses-per-socket applies to --websocket runs only",
            ))
        }
        (None, false) => return Ok(None),
    };
    let protocol = match choice {
        WsChoice::Responses => WsProtocol::Responses,
        WsChoice::Realtime => WsProtocol::Realtime,
        WsChoice::Auto => WsProtocol::from_path(url.path())
            .ok_or_else(|| ConfigError::WebSocketApi(url.path().to_owned()))?,
    };
    let per_socket = positive_u64(request.responses_per_socket, "--responses-per-socket")?;
    if per_socket > 1 && args.load.rate.is_some() {
        return Err(ConfigError::WebSocket(
            "--responses-per-socket above 1 needs the closed loop (no --rate)",
        ));
    }
    if args.load.http2 {
        return Err(ConfigError::WebSocket(
            "--websocket speaks HTTP/1.1 upgrades only, not --http2",
        ));
    }
    let beta = headers
        .get_all("openai-beta")
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("realtime=v1")));
    Ok(Some(WsSettings {
        protocol,
        per_socket,
        realtime: RealtimeAsk {
            audio: request.realtime_output == RealtimeOutput::Audio,
            beta,
        },
    }))
}

fn positive_u64(value: u64, flag: &'static str) -> Result<u64, ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero(flag))
    } else {
        Ok(value)
    }
}

/// The headers every request starts from: JSON and the probe's `User-Agent`.
fn default_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
    headers
}

/// The request headers (the defaults, the API key's `Authorization`, then the user's, which
/// replace a default of the same name) and the credentials among them.
fn request_headers(request: &RequestArgs) -> Result<(HeaderMap, Secrets), ConfigError> {
    let mut headers = default_headers();
    let mut secrets = Secrets::default();
    if let Some(key) = request.api_key.as_ref().filter(|k| !k.expose().is_empty()) {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| ConfigError::InvalidApiKey)?;
        value.set_sensitive(true);
        secrets.add(key.expose());
        headers.insert(AUTHORIZATION, value);
    }
    let mut user_headers = HeaderMap::new();
    for text in &request.headers {
        let (name, mut value) = parse_header(text)?;
        if Secrets::is_credential(&name) {
            secrets.add(value.to_str().unwrap_or_default());
            value.set_sensitive(true);
        }
        user_headers.append(name, value);
    }
    for name in user_headers.keys() {
        headers.remove(name);
    }
    headers.extend(user_headers);
    Ok((headers, secrets))
}

/// The default request for `model`: see [`chat_request`] (no `ignore_eos`).
pub fn chat_body(model: &str, prompt: &str, max_tokens: u32) -> Bytes {
    chat_request(
        model,
        prompt,
        OutputLength {
            max_tokens,
            ignore_eos: false,
        },
    )
}

/// Parses `--url`, refusing what the client cannot reach and filling in the chat path.
pub fn parse_url(text: &str) -> Result<Uri, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidUrl {
        url: text.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = text
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(ConfigError::UnsupportedScheme(format!("{other}://"))),
        None => {
            return Err(invalid(
                "it has no scheme (write e.g. http://127.0.0.1:8000)",
            ))
        }
    }
    if uri.host().is_none() {
        return Err(invalid("it has no host"));
    }
    let has_path = uri.path_and_query().is_some_and(|p| p.as_str() != "/");
    if has_path {
        return Ok(uri);
    }
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(DEFAULT_PATH));
    Uri::from_parts(parts).map_err(|e| invalid(&e.to_string()))
}

/// Parses one `--header 'Name: value'`.
fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), ConfigError> {
    let invalid = || ConfigError::InvalidHeader(text.to_owned());
    let (name, value) = text.split_once(':').ok_or_else(invalid)?;
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| invalid())?;
    let value = HeaderValue::from_str(value.trim()).map_err(|_| invalid())?;
    Ok((name, value))
}

fn positive(value: usize, flag: &'static str) -> Result<usize, ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero(flag))
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProbeArgs,
    }

    fn config(line: &[&str]) -> Result<ProbeConfig, ConfigError> {
        let mut cli =
            Cli::try_parse_from(std::iter::once("probe").chain(line.iter().copied())).unwrap();
        cli.args.request.model.get_or_insert_with(|| "m".to_owned());
        ProbeConfig::try_from(&cli.args)
    }

    #[test]
    fn defaults_are_a_closed_loop_of_ten_chat_streams() {
        let c = config(&["--url", "http://127.0.0.1:8000"]).unwrap();
        assert_eq!(
            c.url.to_string(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(c.load, Load::Closed { concurrency: 1 });
        assert_eq!(c.stop, Stop::Requests(10));
        let body: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
        assert_eq!(body["stream"], true);
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(c.headers[CONTENT_TYPE], "application/json");
        assert_eq!(c.stall_threshold, Duration::from_millis(200));
        assert_eq!(c.timeout, Duration::from_secs(120));
    }

    #[test]
    fn think_tags_and_a_start_in_the_thinking_are_read_as_a_routes() {
        let c = config(&["--url", "http://h:1"]).unwrap();
        assert_eq!(
            c.think.tags.as_deref(),
            ThinkTags::new("<think>", "</think>").as_ref()
        );
        assert_eq!(c.think.start, ThinkStart::Detect);
        let c = config(&[
            "--url",
            "http://h:1",
            "--think-tags",
            "<reason>,</reason>",
            "--think-starts-open",
        ])
        .unwrap();
        let tags = ThinkTags::new("<reason>", "</reason>");
        assert_eq!(c.think.tags.as_deref(), tags.as_ref());
        assert_eq!(c.think.start, ThinkStart::Open);
        for bad in ["<think>", ",</think>", "<think>,"] {
            let line = ["probe", "--url", "http://h:1", "--think-tags", bad];
            assert!(Cli::try_parse_from(line).is_err(), "{bad}");
        }
    }

    #[test]
    fn open_loop_duration_and_headers() {
        let c = config(&[
            "--url",
            "http://h:1/v1/completions",
            "--rate",
            "5",
            "--duration",
            "30s",
            "-H",
            "Authorization: Bearer x",
            "-H",
            "content-type: application/x-test",
        ])
        .unwrap();
        assert_eq!(c.url.path(), "/v1/completions");
        assert_eq!(
            c.load,
            Load::Open {
                rate: 5.0,
                max_in_flight: None
            }
        );
        assert_eq!(c.stop, Stop::After(Duration::from_secs(30)));
        assert_eq!(c.headers["authorization"], "Bearer x");
        assert_eq!(c.headers.get_all(CONTENT_TYPE).iter().count(), 1);
        assert_eq!(c.headers[CONTENT_TYPE], "application/x-test");
    }

    #[test]
    fn gaps_csv_needs_join() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(
                ["probe", "--url", "http://h:1"]
                    .iter()
                    .chain(extra)
                    .copied(),
            )
        };
        let err = parse(&["--gaps-csv", "g.csv"]).err().unwrap().to_string();
        assert!(err.contains("--join"), "{err}");
        let ok = parse(&["--gaps-csv", "g.csv", "--join", "http://a:1"]).unwrap();
        assert_eq!(ok.args.output.gaps_csv, Some(PathBuf::from("g.csv")));
    }

    #[test]
    fn websocket_runs() {
        let c = config(&["--url", "ws://h:1/v1/realtime", "--realtime-output", "text"]).unwrap();
        assert_eq!(c.url.to_string(), "http://h:1/v1/realtime");
        let ws = c.websocket.unwrap();
        assert_eq!(ws.protocol, WsProtocol::Realtime);
        assert!(!ws.realtime.audio && !ws.realtime.beta);
        let c = config(&[
            "--url",
            "https://h/v1/responses",
            "--websocket",
            "--responses-per-socket",
            "3",
        ])
        .unwrap();
        let ws = c.websocket.unwrap();
        assert_eq!((ws.protocol, ws.per_socket), (WsProtocol::Responses, 3));
        let c = config(&[
            "--url",
            "http://h/x",
            "--websocket",
            "realtime",
            "-H",
            "OpenAI-Beta: realtime=v1",
        ])
        .unwrap();
        assert!(c.websocket.unwrap().realtime.beta);
        assert!(config(&["--url", "http://h"]).unwrap().websocket.is_none());
        assert!(matches!(
            config(&["--url", "ws://h/v1/chat/completions"]),
            Err(ConfigError::WebSocketApi(_))
        ));
        for refused in [
            &[
                "--url",
                "http://h/v1/responses",
                "--responses-per-socket",
                "2",
            ][..],
            &[
                "--url",
                "ws://h/v1/responses",
                "--rate",
                "2",
                "--responses-per-socket",
                "2",
            ],
            &["--url", "ws://h/v1/responses", "--http2"],
        ] {
            assert!(
                matches!(config(refused), Err(ConfigError::WebSocket(_))),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn usage_errors() {
        assert!(matches!(
            config(&["--url", "ftp://h/"]),
            Err(ConfigError::UnsupportedScheme(_))
        ));
        assert!(matches!(
            config(&["--url", "http://h", "--cacert", "/nonexistent/ca.pem"]),
            Err(ConfigError::CaWithoutTls)
        ));
        let missing = config(&["--url", "https://h", "--cacert", "/nonexistent/ca.pem"]);
        assert!(
            matches!(&missing, Err(e @ ConfigError::InvalidCa(_)) if e.to_string().contains("/nonexistent/ca.pem")),
            "{missing:?}"
        );
        let not_pem = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_pem.path(), "not a certificate").unwrap();
        let path = not_pem.path().to_str().unwrap();
        assert!(matches!(
            config(&["--url", "https://h", "--cacert", path]),
            Err(ConfigError::InvalidCa(_))
        ));
        let https = config(&["--url", "https://h:8443", "--http2"]).unwrap();
        assert_eq!(https.url.to_string(), "https://h:8443/v1/chat/completions");
        assert!(https.http2 && https.ca.is_none());
        assert!(matches!(
            config(&["--url", "127.0.0.1:8000"]),
            Err(ConfigError::InvalidUrl { .. })
        ));
        assert!(matches!(
            config(&["--url", "http://h", "-H", "no colon"]),
            Err(ConfigError::InvalidHeader(_))
        ));
        assert!(matches!(
            config(&["--url", "http://h", "-c", "0"]),
            Err(ConfigError::Zero(_))
        ));
        assert!(matches!(
            config(&["--url", "http://h", "--rate", "0"]),
            Err(ConfigError::InvalidRate(_))
        ));
        assert!(matches!(
            config(&["--url", "http://h", "--body", "/nonexistent/body.json"]),
            Err(ConfigError::UnreadableBody { .. })
        ));
    }
}
