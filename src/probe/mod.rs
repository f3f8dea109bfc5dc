//! `metronome probe`: streams requests and measures the cadence at the client.
//!
//! It is the third clock of DESIGN.md (ingress, egress, **client**): every body frame is stamped
//! as it arrives, token events are found by the same scanner and accounting as the proxy's, and
//! the gaps between them are summarized into TTFT, ITL percentiles, tokens/s, stall share, jank
//! ratio and a SMOOTH / JANKY verdict. Gates (`--assert 'itl_p99<250ms'`) make it a CI check.
//!
//! Module map, in the order a run flows through them:
//! - [`args`]: the command line and the validated [`ProbeConfig`] (all usage errors are caught here).
//! - [`client`]: the pooled HTTP client (http and https, rustls) and the closed or open loop that runs the streams
//!   ([`measure`] → [`ProbeRun`]).
//! - [`stream`]: one stream's record ([`StreamRecord`]) and the recorder that fills it frame by frame.
//! - [`stats`]: percentiles, stalls, jank, reading bands, verdict ([`summarize`] → [`Report`]).
//! - [`gates`]: `--assert` parsing and evaluation.
//! - [`report_text`], [`report_html`]: the report for a terminal and as a self-contained page.
//! - [`join`] and [`attribution`]: `--join`, fetching each stream's timeline from metronome's
//!   admin listener and splitting the client's gaps into generation, metronome and after metronome.
//! - [`limits`]: raising the open-file limit for thousands of concurrent streams.
//!
//! Exit codes of the command: 0 when every gate passes (or there are none), 1 when a gate fails,
//! 2 for a usage error (bad flag, bad gate, unreadable `--body` or `--cacert`) or when the report cannot be
//! written. Failed streams never change the exit code by themselves: gate on `errors<1` for that.

pub mod args;
pub mod attribution;
pub mod client;
pub mod gates;
pub mod join;
pub mod limits;
pub mod report_html;
pub mod report_text;
pub mod stats;
pub mod stream;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use args::{
    ConfigError, Load, LoadArgs, OutputArgs, ProbeArgs, ProbeConfig, RequestArgs, Stop,
};
pub use attribution::{
    gaps_csv, Attribution, AttributionBuilder, GapRow, Unjoined, GAP_ROWS_CSV_HEADER,
};
pub use client::{measure, measure_with, ProbeError, ProbeRun};
pub use gates::{evaluate, parse_gates, Gate, GateError, GateOutcome, Metric, Op};
pub use join::{attribute_run, attribute_run_with_rows, AdminUrl, AdminUrlError};
pub use report_html::render_html;
pub use report_text::render_text;
pub use stats::{detail_json, summarize, Report, Verdict};
pub use stream::{Read, StreamError, StreamRecord};

/// Exit code when a gate fails.
const GATE_FAILED: u8 = 1;
/// Exit code for a usage error or a report that cannot be written.
const USAGE: u8 = 2;

/// Entry point of the `probe` subcommand.
pub async fn run(args: ProbeArgs) -> ExitCode {
    let config = match ProbeConfig::try_from(&args) {
        Ok(config) => config,
        Err(e) => return usage(&e),
    };
    let gates = match parse_gates(&args.output.gates) {
        Ok(gates) => gates,
        Err(e) => return usage(&e),
    };
    let join = match args.output.join.as_deref().map(AdminUrl::parse).transpose() {
        Ok(join) => join,
        Err(e) => return usage(&e),
    };
    if let Some(limit) = limits::raise_open_file_limit() {
        tracing::debug!(limit, "open-file limit");
    }

    let progress = progress_bar(config.stop);
    let run = match measure_with(&config, |_| progress.inc(1)).await {
        Ok(run) => run,
        Err(e) => return usage(&e),
    };
    progress.finish_and_clear();

    let mut report = summarize(&run, config.stall_threshold);
    match (&join, &args.output.gaps_csv) {
        (Some(admin), Some(path)) => {
            let (attribution, rows) = attribute_run_with_rows(admin, &run).await;
            report.attribution = Some(attribution);
            if let Err(e) = write_file(path, &gaps_csv(&rows)) {
                return usage(&e);
            }
        }
        // Without --gaps-csv the rows are not kept (about 40 bytes a gap).
        (Some(admin), None) => report.attribution = Some(attribute_run(admin, &run).await),
        // clap requires --join for --gaps-csv.
        (None, _) => {}
    }
    println!("metronome probe: {}", describe(&config));
    print!("{}", render_text(&report));
    if let Some(path) = &args.output.json {
        let json = match serde_json::to_string_pretty(&report) {
            Ok(json) => json + "\n",
            Err(e) => return usage(&e),
        };
        if let Err(e) = write_file(path, &json) {
            return usage(&e);
        }
    }
    if let Some(path) = &args.output.detail {
        let json = match serde_json::to_string_pretty(&detail_json(&report)) {
            Ok(json) => json + "\n",
            Err(e) => return usage(&e),
        };
        if let Err(e) = write_file(path, &json) {
            return usage(&e);
        }
    }
    if let Some(path) = &args.output.html {
        let html = render_html(&run, &report, &describe(&config));
        if let Err(e) = write_file(path, &html) {
            return usage(&e);
        }
    }

    let outcomes = evaluate(&gates, &report);
    for outcome in &outcomes {
        println!("{outcome}");
    }
    if outcomes.iter().all(|o| o.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(GATE_FAILED)
    }
}

fn usage(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(USAGE)
}

/// A report file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
struct WriteError {
    path: String,
    source: std::io::Error,
}

fn write_file(path: &Path, contents: &str) -> Result<(), WriteError> {
    std::fs::write(path, contents).map_err(|source| WriteError {
        path: path.display().to_string(),
        source,
    })
}

/// One line saying what was probed and how.
fn describe(config: &ProbeConfig) -> String {
    let load = match config.load {
        Load::Closed { concurrency } => format!("closed loop, concurrency {concurrency}"),
        Load::Open {
            rate,
            max_in_flight: Some(cap),
        } => format!("open loop, {rate}/s, at most {cap} in flight"),
        Load::Open { rate, .. } => format!("open loop, {rate}/s"),
    };
    let load = if config.http2 {
        format!("{load}, HTTP/2")
    } else {
        load
    };
    let stop = match config.stop {
        Stop::Requests(n) => format!("{n} streams"),
        Stop::After(d) => format!("streams for {}", crate::units::format_duration(d)),
    };
    format!("{stop} to {} ({load})", config.url)
}

/// A bar on stderr when it is a terminal; hidden otherwise (CI logs stay clean).
fn progress_bar(stop: Stop) -> ProgressBar {
    let bar = match stop {
        Stop::Requests(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
        Stop::After(_) => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = match stop {
        Stop::Requests(_) => "{bar:40} {pos}/{len} streams done {elapsed}",
        Stop::After(_) => "{spinner} {pos} streams done {elapsed}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
