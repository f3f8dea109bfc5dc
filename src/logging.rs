//! Logging: where lines go, how they look, and the optional access log.
//!
//! Lines go to stderr. Colour codes are written only when stderr is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>), so `kubectl logs` and files get plain text.
//! `--log-format json` writes one JSON object a line (tracing-subscriber's json formatter), for
//! log pipelines; every stream-related line carries the stream's ID as `stream_id`, the value of
//! the stream ID response header, so a line can be joined with `/streams` and the client's logs.
//!
//! The access log (`--access-log`) is one line per request at its end, under the target
//! `metronome::access`: request ID, stream ID, method, path (no query), route, model, status,
//! outcome, finish reason, duration and TTFT (whole milliseconds), output tokens and stalls. It never
//! carries a header value, a body or a query string: the route is the configured route's name,
//! not the request's path.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The target of access log lines, so a filter can keep or drop them on their own.
pub const ACCESS_TARGET: &str = "metronome::access";

/// Whether access log lines are written; set once by [`init`], read once per request.
static ACCESS_LOG: AtomicBool = AtomicBool::new(false);

/// How log lines are written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colour only on a terminal without `NO_COLOR`).
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// The logging flags every subcommand takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "METRONOME_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: LogFormat,
    /// Write one access log line per request (route, status, duration, TTFT, stalls, outcome,
    /// stream ID; never a header value, body or query string).
    #[arg(long, global = true, env = "METRONOME_ACCESS_LOG")]
    pub access_log: bool,
}

/// Installs the `tracing` subscriber on stderr, filtered by `RUST_LOG` (default `info`; the
/// access log stays at `info` when it is on, whatever `RUST_LOG` says). Called once, by the
/// binary.
pub fn init(args: &LogArgs) {
    let ansi = use_ansi(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if args.access_log {
        if let Ok(directive) = format!("{ACCESS_TARGET}=info").parse() {
            filter = filter.add_directive(directive);
        }
    }
    ACCESS_LOG.store(args.access_log, Ordering::Relaxed);
    let _ = install(args.log_format, ansi, filter, std::io::stderr);
}

/// Builds and installs the subscriber: one place for `init` and the tests' captured writers.
fn install<W>(
    format: LogFormat,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
) -> Result<(), tracing_subscriber::util::TryInitError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::util::SubscriberInitExt;
    subscriber(format, ansi, filter, writer).try_init()
}

/// The subscriber for `format`, writing to `writer`.
fn subscriber<W>(
    format: LogFormat,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_ansi(false)
                .with_current_span(false)
                .flatten_event(true)
                .finish(),
        ),
    }
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything but the empty string.
fn use_ansi(is_terminal: bool, no_color: Option<OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether the access log is on: callers skip gathering a line's fields when it is off.
pub fn access_log_enabled() -> bool {
    ACCESS_LOG.load(Ordering::Relaxed)
}

/// The longest request path an access line carries; a longer one is cut (and marked `…`).
const MAX_LOGGED_PATH: usize = 256;

/// What the access log tells of a request itself, taken from its head before it moves on.
#[derive(Debug, Clone, Default)]
pub struct RequestLine {
    /// Its method.
    pub method: http::Method,
    /// Its path, without the query (which may hold a key) and at most 256 characters.
    pub path: String,
    /// Its `x-request-id`, as bounded by the proxy.
    pub request_id: Option<String>,
}

// === impl RequestLine ===

impl RequestLine {
    /// The line of a request with this method and target.
    pub fn new(method: &http::Method, uri: &http::Uri, request_id: Option<String>) -> Self {
        let full = uri.path();
        let path = match full.char_indices().nth(MAX_LOGGED_PATH) {
            Some((cut, _)) => format!("{}…", &full[..cut]),
            None => full.to_string(),
        };
        RequestLine {
            method: method.clone(),
            path,
            request_id,
        }
    }
}

/// One request, as its access log line tells it.
#[derive(Debug, Clone, Default)]
pub struct AccessRecord<'a> {
    /// The request's method, path (no query) and `x-request-id`, when known.
    pub line: Option<&'a RequestLine>,
    /// The configured route's name.
    pub route: &'a str,
    /// The stream's model label, for a metered stream.
    pub model: Option<&'a str>,
    /// The HTTP status sent to the client.
    pub status: u16,
    /// From the request's arrival to its end.
    pub duration: Option<Duration>,
    /// Time to the first token at egress, when a token reached the client.
    pub ttft: Option<Duration>,
    /// Time to the first output token (not reasoning) at egress, when one reached the client.
    pub ttfo: Option<Duration>,
    /// First to last reasoning token event at egress, for a stream that reasoned.
    pub reasoning: Option<Duration>,
    /// Stalls at egress.
    pub stalls: u64,
    /// How it ended: a stream outcome (`complete`, `client_cancelled`, ...) or an error kind.
    pub outcome: &'a str,
    /// The stream ID the response header carried, when the request became a metered stream.
    pub stream_id: Option<&'a str>,
    /// Output tokens of a metered stream (the server's usage, or counted).
    pub output_tokens: Option<u64>,
    /// Why a metered stream ended, as the `finish_reason` label says it.
    pub finish_reason: Option<&'a str>,
}

/// Writes the access log line of one request, when the access log is on.
pub fn access(record: &AccessRecord<'_>) {
    if !access_log_enabled() {
        return;
    }
    write_access(record);
}

/// The line itself, whatever the switch says (the tests capture it).
fn write_access(record: &AccessRecord<'_>) {
    // Whole milliseconds: a log is read by people and grep, not measured from.
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let line = record.line;
    tracing::info!(
        target: ACCESS_TARGET,
        request_id = line.and_then(|l| l.request_id.as_deref()),
        stream_id = record.stream_id,
        method = line.map(|l| l.method.as_str()),
        path = line.map(|l| l.path.as_str()),
        route = record.route,
        model = record.model,
        status = record.status,
        outcome = record.outcome,
        finish_reason = record.finish_reason,
        duration_ms = ms(record.duration),
        ttft_ms = ms(record.ttft),
        ttfo_ms = ms(record.ttfo),
        reasoning_ms = ms(record.reasoning),
        output_tokens = record.output_tokens,
        stalls = record.stalls,
        "access"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what it is given.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn captured(format: LogFormat, ansi: bool, emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let subscriber = subscriber(format, ansi, EnvFilter::new("info"), out.clone());
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn record() -> AccessRecord<'static> {
        static LINE: std::sync::OnceLock<RequestLine> = std::sync::OnceLock::new();
        let line = LINE.get_or_init(|| {
            let uri = http::Uri::from_static("/v1/chat/completions?api_key=secret");
            RequestLine::new(&http::Method::POST, &uri, Some("req-7".into()))
        });
        AccessRecord {
            line: Some(line),
            route: "chat",
            model: Some("llama"),
            status: 200,
            duration: Some(Duration::from_micros(1_500_700)),
            ttft: Some(Duration::from_micros(120_900)),
            ttfo: Some(Duration::from_micros(900_400)),
            reasoning: Some(Duration::from_micros(750_000)),
            stalls: 2,
            outcome: "complete",
            stream_id: Some("01JABCDEF"),
            output_tokens: Some(57),
            finish_reason: Some("stop"),
        }
    }

    #[test]
    fn a_long_path_is_cut_and_the_query_left_out() {
        let long = format!("/v1/{}?k=v", "é".repeat(300));
        let line = RequestLine::new(&http::Method::GET, &long.parse().unwrap(), None);
        assert_eq!(line.path.chars().count(), MAX_LOGGED_PATH + 1);
        assert!(line.path.ends_with('…') && !line.path.contains('?'));
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(
            use_ansi(true, Some(OsString::new())),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_ansi(true, Some(OsString::from("1"))));
        assert!(!use_ansi(false, None));
    }

    #[test]
    fn plain_text_has_no_escape_codes() {
        let text = captured(LogFormat::Text, false, || write_access(&record()));
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(text.contains("stream_id=\"01JABCDEF\"") || text.contains("stream_id=01JABCDEF"));
        let coloured = captured(LogFormat::Text, true, || write_access(&record()));
        assert!(
            coloured.contains('\u{1b}'),
            "the switch does something: {coloured:?}"
        );
    }

    #[test]
    fn an_access_line_in_json_has_every_field_and_nothing_else() {
        let text = captured(LogFormat::Json, false, || write_access(&record()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(line["target"], ACCESS_TARGET);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "access");
        assert_eq!(line["stream_id"], "01JABCDEF");
        assert_eq!(line["route"], "chat");
        assert_eq!(line["status"], 200);
        assert_eq!(line["duration_ms"], 1500, "whole milliseconds");
        assert_eq!(line["ttft_ms"], 120);
        assert_eq!(line["ttfo_ms"], 900);
        assert_eq!(line["reasoning_ms"], 750);
        assert_eq!(line["stalls"], 2);
        assert_eq!(line["outcome"], "complete");
        assert_eq!(line["request_id"], "req-7");
        assert_eq!(line["method"], "POST");
        assert_eq!(line["path"], "/v1/chat/completions", "no query");
        assert_eq!(line["model"], "llama");
        assert_eq!(line["output_tokens"], 57);
        assert_eq!(line["finish_reason"], "stop");
        let mut keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "duration_ms",
                "finish_reason",
                "level",
                "message",
                "method",
                "model",
                "outcome",
                "output_tokens",
                "path",
                "reasoning_ms",
                "request_id",
                "route",
                "stalls",
                "status",
                "stream_id",
                "target",
                "timestamp",
                "ttfo_ms",
                "ttft_ms"
            ]
        );
    }

    #[test]
    fn the_access_log_is_off_unless_asked_for() {
        // Nothing in the tests turns it on: `access` writes nothing.
        let text = captured(LogFormat::Json, false, || access(&record()));
        assert_eq!(text, "");
    }
}
