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
//! - [`report_text`], [`report_html`] (and [`report_html_more`]): the report for a terminal and
//!   as a self-contained page.
//! - [`join`] and [`attribution`]: `--join`, fetching each stream's timeline from metronome's
//!   admin listener and splitting the client's gaps into generation, metronome and after metronome.
//! - [`limits`]: raising the open-file limit for thousands of concurrent streams.
//! - [`workload`]: `--input-tokens`, `--output-tokens`, `--dataset`: what each request asks for.
//! - [`models`]: the default model, from the server's `/v1/models`.
//! - [`progress`]: the bar on a terminal, a line every `--progress-interval` off one.
//! - [`goodput`]: `--slo`, per-stream objectives and the goodput share (as vllm bench computes it).
//! - [`baseline`]: `--baseline` and `probe compare`: deltas against an earlier report.
//! - [`report_ci`]: `--junit` and `--markdown`, the reports CI systems render.
//! - [`meta`]: the run's metadata in the JSON.
//!
//! Exit codes of the command: 0 when every gate passes (or there are none), 1 when a gate fails,
//! 2 for a usage error (bad flag, bad gate, unreadable `--body`, `--cacert` or `--baseline`) or
//! when a report cannot be written, 3 when the run itself failed: no stream completed, more than
//! `--max-error-rate` of them failed, or no model could be found. 3 wins over 1: a gate measured
//! on a broken run means nothing.

pub mod args;
pub mod attribution;
pub mod baseline;
pub mod client;
pub mod gates;
pub mod goodput;
pub mod join;
pub mod limits;
pub mod meta;
pub mod models;
pub mod progress;
pub mod report_ci;
pub mod report_html;
pub mod report_html_more;
pub mod report_text;
pub mod stats;
pub mod stream;
pub mod workload;

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

pub use args::{
    ConfigError, Load, LoadArgs, OutputArgs, ProbeArgs, ProbeCommand, ProbeConfig, RequestArgs,
    Stop,
};
pub use attribution::{
    gaps_csv, Attribution, AttributionBuilder, GapRow, Unjoined, GAP_ROWS_CSV_HEADER,
};
pub use client::{measure, measure_counting, measure_with, ProbeError, ProbeRun};
pub use gates::{evaluate, parse_gates, Bound, Gate, GateError, GateOutcome, Metric, Op};
pub use join::{
    attribute_run, attribute_run_judged, attribute_run_with_rows, AdminUrl, AdminUrlError,
};
pub use report_html::render_html;
pub use report_text::render_text;
pub use stats::{detail_json, summarize, Report, Verdict};
pub use stream::{Read, StreamError, StreamRecord};

use goodput::{Slo, StreamFigures};
use progress::Progress;
use report_ci::Judged;

/// Exit code when a gate fails.
const GATE_FAILED: u8 = 1;
/// Exit code for a usage error or a report that cannot be written.
const USAGE: u8 = 2;
/// Exit code when the run itself failed (no stream completed, too many failed, no model).
const RUN_FAILED: u8 = 3;

/// Everything a run checks and writes, parsed from the command line before any request.
struct Plan {
    gates: Vec<Gate>,
    slo: Option<(String, Vec<Slo>)>,
    baseline: Option<serde_json::Value>,
    join: Option<AdminUrl>,
}

/// Entry point of the `probe` subcommand.
pub async fn run(mut args: ProbeArgs) -> ExitCode {
    if let Some(ProbeCommand::Compare { a, b }) = &args.command {
        return compare(a, b);
    }
    // Every usage error is found before the first request, the model list's included.
    let plan = match plan(&args) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    if args.request.model.is_none() && args.request.body.is_none() {
        match find_model(&args).await {
            Ok(model) => args.request.model = Some(model),
            Err(code) => return code,
        }
    }
    let config = match ProbeConfig::try_from(&args) {
        Ok(config) => config,
        Err(e) => return usage(&e),
    };
    if let Some(limit) = limits::raise_open_file_limit() {
        tracing::debug!(limit, "open-file limit");
    }
    let configs: Vec<(Option<String>, ProbeConfig)> = if args.load.rate_sweep.is_empty() {
        vec![(None, config)]
    } else {
        args.load
            .rate_sweep
            .iter()
            .map(|&rate| {
                let mut c = config.clone();
                c.load = Load::Open {
                    rate,
                    max_in_flight: args.load.concurrency,
                };
                (Some(format!("rate {rate}/s")), c)
            })
            .collect()
    };
    let mut judged = Vec::new();
    let mut last_run = None;
    for (label, config) in &configs {
        let (run, report) = match measure_one(&args, config, label.as_deref(), &plan).await {
            Ok(done) => done,
            Err(code) => return code,
        };
        let outcomes = evaluate(&plan.gates, &report, plan.baseline.as_ref());
        let run_failure = run_failure(&report, args.output.max_error_rate);
        println!("metronome probe: {}", describe(config));
        print!("{}", render_text(&report));
        judged.push(Judged {
            label: label.clone(),
            report,
            outcomes,
            run_failure,
        });
        last_run = Some(run);
    }
    if judged.len() > 1 {
        print!("{}", report_text::render_sweep(&judged));
    }
    let baseline_table = plan.baseline.as_ref().and_then(|b| {
        let now = serde_json::to_value(&judged.first()?.report).ok()?;
        let rows = baseline::deltas(b, &now);
        let name = args.output.baseline.as_deref().map(baseline::short_name)?;
        println!("against the baseline {name}:");
        print!("{}", baseline::render_text("baseline", "this run", &rows));
        Some(baseline::render_markdown("baseline", "this run", &rows))
    });
    for run in &judged {
        let prefix = run
            .label
            .as_ref()
            .map(|l| format!("[{l}] "))
            .unwrap_or_default();
        for outcome in &run.outcomes {
            println!("{prefix}{outcome}");
        }
        if let Some(why) = &run.run_failure {
            eprintln!("error: {prefix}the run failed: {why}");
            for (kind, example) in &run.report.detail.error_examples {
                let n = run
                    .report
                    .detail
                    .errors_by_kind
                    .get(kind)
                    .copied()
                    .unwrap_or(0);
                eprintln!("  {kind} ({n}): {example}");
            }
        }
    }
    if let Err(e) = write_reports(
        &args,
        &configs[0].1,
        &judged,
        last_run.as_ref(),
        baseline_table.as_deref(),
    ) {
        return usage(&e);
    }
    if judged.iter().any(|r| r.run_failure.is_some()) {
        ExitCode::from(RUN_FAILED)
    } else if judged.iter().all(|r| r.outcomes.iter().all(|o| o.passed)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(GATE_FAILED)
    }
}

/// Asks the server's `/v1/models` for the model to use (exit 3 when it cannot say).
async fn find_model(args: &ProbeArgs) -> Result<String, ExitCode> {
    let mut probe_args = args.clone();
    probe_args.request.model = Some(String::new());
    let config = ProbeConfig::try_from(&probe_args).map_err(|e| usage(&e))?;
    match models::discover_model(&config).await {
        Ok(model) => {
            eprintln!(
                "metronome probe: no --model given; using `{model}`, the first model {} lists",
                models::models_url(&config.url)
            );
            Ok(model)
        }
        Err(e) => {
            eprintln!("error: no --model given, and none could be found: {e}");
            eprintln!("  give the model to ask for with --model NAME");
            Err(ExitCode::from(RUN_FAILED))
        }
    }
}

/// Parses the gates, the objectives, the baseline and the join URL (usage errors, exit 2).
fn plan(args: &ProbeArgs) -> Result<Plan, ExitCode> {
    let gates = parse_gates(&args.output.gates).map_err(|e| usage(&e))?;
    gates::check_baseline(&gates, args.output.baseline.is_some()).map_err(|e| usage(&e))?;
    let slo = match &args.output.slo {
        Some(text) => Some((
            text.clone(),
            goodput::parse_slo(text).map_err(|e| usage(&e))?,
        )),
        None => None,
    };
    let baseline = match &args.output.baseline {
        Some(path) => Some(baseline::load(path).map_err(|e| usage(&e))?),
        None => None,
    };
    let join = match args.output.join.as_deref().map(AdminUrl::parse).transpose() {
        Ok(join) => join,
        Err(e) => return Err(usage(&e)),
    };
    Ok(Plan {
        gates,
        slo,
        baseline,
        join,
    })
}

/// Runs one load (one rate of a sweep) with its progress, and summarizes it.
async fn measure_one(
    args: &ProbeArgs,
    config: &ProbeConfig,
    label: Option<&str>,
    plan: &Plan,
) -> Result<(ProbeRun, Report), ExitCode> {
    let label = label.map(|l| format!(" ({l})")).unwrap_or_default();
    let progress = Progress::start(config.stop, args.output.progress_interval, label);
    let started = SystemTime::now();
    let run = measure_counting(config, progress.sent.clone(), |s| progress.stream_ended(s))
        .await
        .map_err(|e| usage(&e))?;
    progress.finish();
    let mut report = summarize(&run, config.stall_threshold);
    let wall = report.detail.wall_time;
    if let Some((text, slos)) = &plan.slo {
        let figures: Vec<_> = run
            .streams
            .iter()
            .map(|s| StreamFigures::of(s, config.stall_threshold))
            .collect();
        report.goodput = Some(goodput::goodput(text, slos, &figures, wall));
    }
    report.meta = Some(meta::run_meta(config, started, wall));
    match (&plan.join, &args.output.gaps_csv) {
        (Some(admin), Some(path)) => {
            let (attribution, rows) =
                attribute_run_judged(admin, &run, config.stall_threshold, true).await;
            report.attribution = Some(attribution);
            write_file(path, &gaps_csv(&rows)).map_err(|e| usage(&e))?;
        }
        // Without --gaps-csv the rows are not kept (about 40 bytes a gap).
        (Some(admin), None) => {
            let judged = attribute_run_judged(admin, &run, config.stall_threshold, false).await;
            report.attribution = Some(judged.0);
        }
        // clap requires --join for --gaps-csv.
        (None, _) => {}
    }
    Ok((run, report))
}

/// Why the run itself failed, if it did: no stream completed, or more than `max_error_rate` of
/// them failed.
pub fn run_failure(report: &Report, max_error_rate: f64) -> Option<String> {
    let (n, failed) = (report.requests, report.errors);
    if n == failed {
        return Some(format!("no stream completed ({failed} of {n} failed)"));
    }
    let rate = failed as f64 / n as f64;
    (rate > max_error_rate).then(|| {
        format!(
            "{failed} of {n} streams failed ({:.1}%, more than --max-error-rate {})",
            rate * 100.0,
            max_error_rate
        )
    })
}

/// Writes every report file asked for.
fn write_reports(
    args: &ProbeArgs,
    config: &ProbeConfig,
    judged: &[Judged],
    last_run: Option<&ProbeRun>,
    baseline_table: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let out = &args.output;
    let single = match judged {
        [one] => Some(&one.report),
        _ => None,
    };
    if let Some(path) = &out.json {
        let json = match single {
            Some(report) => serde_json::to_string_pretty(report)?,
            None => {
                let rows = judged
                    .iter()
                    .map(|j| {
                        let mut row = serde_json::to_value(&j.report)?;
                        if let (Some(meta), Some(object)) = (&j.report.meta, row.as_object_mut()) {
                            object.insert("rate".to_owned(), serde_json::json!(meta.rate));
                        }
                        Ok(row)
                    })
                    .collect::<Result<Vec<_>, serde_json::Error>>()?;
                serde_json::to_string_pretty(&serde_json::json!({ "sweep": rows }))?
            }
        };
        write_file(
            path,
            &(json
                + "
"),
        )?;
    }
    if let (Some(path), Some(report)) = (&out.detail, single) {
        write_file(
            path,
            &(serde_json::to_string_pretty(&detail_json(report))?
                + "
"),
        )?;
    }
    if let (Some(path), Some(report), Some(run)) = (&out.html, single, last_run) {
        let admin = args.output.join.as_deref();
        let html = report_html::render_html_joined(run, report, &describe(config), admin);
        write_file(path, &html)?;
    }
    if let Some(path) = &out.junit {
        write_file(path, &report_ci::render_junit(judged))?;
    }
    if let Some(path) = &out.markdown {
        let text = report_ci::render_markdown(&describe(config), judged, baseline_table);
        write_file(path, &text)?;
        if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()) {
            append_file(Path::new(&summary), &text)?;
        }
    }
    Ok(())
}

/// `metronome probe compare A.json B.json`: the two reports side by side (exit 0, or 2 when one
/// cannot be read).
fn compare(a: &Path, b: &Path) -> ExitCode {
    let (left, right) = match (baseline::load(a), baseline::load(b)) {
        (Ok(left), Ok(right)) => (left, right),
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    let rows = baseline::deltas(&left, &right);
    print!(
        "{}",
        baseline::render_text(&baseline::short_name(a), &baseline::short_name(b), &rows)
    );
    ExitCode::SUCCESS
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

/// Appends to a file (the GitHub step summary collects every step's Markdown).
fn append_file(path: &Path, contents: &str) -> Result<(), WriteError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| WriteError {
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
