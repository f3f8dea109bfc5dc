//! Logging: where lines go, how they look, and the optional access log.
//!
//! Lines go to stderr. Colour codes are written only when stderr is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>), so `kubectl logs` and files get plain text.
//! `--log-format json` writes one JSON object a line (tracing-subscriber's json formatter), for
//! log pipelines; every stream-related line carries the stream's ID as `stream_id`, the value of
//! the stream ID response header, so a line can be joined with `/streams` and the client's logs.
//!
//! The access log (`--access-log`) is one line per request at its end, under the target
//! `metronome::access`: route, status, duration, TTFT, stalls, outcome and stream ID. It never
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

/// One request, as its access log line tells it.
#[derive(Debug, Clone)]
pub struct AccessRecord<'a> {
    /// The configured route's name (never the request path, which may hold a query).
    pub route: &'a str,
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
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    tracing::info!(
        target: ACCESS_TARGET,
        stream_id = record.stream_id,
        route = record.route,
        status = record.status,
        duration_ms = ms(record.duration),
        ttft_ms = ms(record.ttft),
        ttfo_ms = ms(record.ttfo),
        reasoning_ms = ms(record.reasoning),
        stalls = record.stalls,
        outcome = record.outcome,
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
        AccessRecord {
            route: "chat",
            status: 200,
            duration: Some(Duration::from_millis(1500)),
            ttft: Some(Duration::from_millis(120)),
            ttfo: Some(Duration::from_millis(900)),
            reasoning: Some(Duration::from_millis(750)),
            stalls: 2,
            outcome: "complete",
            stream_id: Some("01JABCDEF"),
        }
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
        assert_eq!(line["duration_ms"], 1500.0);
        assert_eq!(line["ttft_ms"], 120.0);
        assert_eq!(line["ttfo_ms"], 900.0);
        assert_eq!(line["reasoning_ms"], 750.0);
        assert_eq!(line["stalls"], 2);
        assert_eq!(line["outcome"], "complete");
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
                "level",
                "message",
                "outcome",
                "reasoning_ms",
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
