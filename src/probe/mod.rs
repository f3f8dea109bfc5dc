//! `metronome probe`: streams requests and measures the cadence at the client.
//!
//! It is the third clock of docs/design.md (ingress, egress, **client**): every body frame is stamped
//! as it arrives, token events are found by the same scanner and accounting as the proxy's, and
//! the gaps between them are summarized into TTFT, ITL percentiles, tokens/s, stall share, jank
//! ratio and a SMOOTH / JANKY verdict. Gates (`--assert 'itl_p99<250ms'`) make it a CI check.
//!
//! Module map, in the order a run flows through them:
//! - [`args`]: the command line and the validated [`ProbeConfig`] (all usage errors are caught here).
//! - [`secrets`]: `--api-key` and credential headers, masked wherever text is kept.
//! - [`client`]: the pooled HTTP client (http and https, rustls) and the closed or open loop that runs the streams
//!   ([`measure`] → [`ProbeRun`]); [`backoff`]: the waits after failed streams and the early end.
//! - [`stream`]: one stream's record ([`StreamRecord`]) and the recorder that fills it frame by frame.
//! - [`stats`]: percentiles, stalls, jank, reading bands ([`summarize`] → [`Report`]); [`verdict`]:
//!   SMOOTH or JANKY, from the streams.
//! - [`compare`] and [`gates`]: `--assert` parsing and evaluation.
//! - [`judged`]: the gates, the run's failure and the one status the exit code and every
//!   report's headline are taken from.
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
//! - [`reports`]: writes every report file asked for, on every exit path.
//! - [`meta`]: the run's metadata in the JSON.
//! - [`ws_protocol`] and [`ws_client`]: `--websocket`, the Responses API's WebSocket mode and
//!   the Realtime API: the messages of a response, their reading, and the sockets.
//!
//! Exit codes of the command: 0 when every gate passes (or there are none), 1 when a gate fails,
//! 2 for a usage error (bad flag, bad gate, unreadable `--body`, `--cacert` or `--baseline`) or
//! when a report cannot be written, 3 when the run itself failed: no stream completed, more than
//! `--max-error-rate` of them failed, or no model could be found. 3 wins over 1: a gate measured
//! on a broken run means nothing. Every report file asked for is written on each of them.

pub mod args;
pub mod attribution;
pub mod backoff;
pub mod baseline;
pub mod client;
pub mod compare;
pub mod gates;
pub mod goodput;
pub mod join;
pub mod judged;
pub mod limits;
pub mod meta;
pub mod models;
pub mod progress;
pub mod report_ci;
pub mod report_html;
pub mod report_html_more;
pub mod report_text;
pub mod reports;
pub mod secrets;
pub mod stats;
pub mod stream;
pub mod verdict;
pub mod workload;
pub mod ws_client;
pub mod ws_protocol;

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

pub use args::{
    ConfigError, Load, LoadArgs, OutputArgs, ProbeArgs, ProbeCommand, ProbeConfig, RealtimeOutput,
    RequestArgs, Stop, WsChoice, WsSettings,
};
pub use attribution::{
    gaps_csv, Attribution, AttributionBuilder, GapRow, Unjoined, GAP_ROWS_CSV_HEADER,
};
pub use client::{measure, measure_counting, measure_with, ProbeError, ProbeRun};
pub use compare::Cmp;
pub use gates::{evaluate, parse_gates, Bound, Gate, GateError, GateOutcome, GateResult, Metric};
pub use join::{
    attribute_run, attribute_run_judged, attribute_run_with_rows, AdminUrl, AdminUrlError,
};
pub use judged::{Judged, RunFailure, Status};
pub use report_html::render_html;
pub use report_text::render_text;
pub use stats::{detail_json, summarize, Report};
pub use stream::{Phase, Read, StreamError, StreamRecord};
pub use verdict::Verdict;
pub use ws_protocol::{RealtimeAsk, WsProtocol};

use goodput::{Slo, StreamFigures};
use judged::FailureKind;
use progress::Progress;
use reports::Outcome;

/// Everything a run checks and writes, parsed from the command line before any request.
struct Plan {
    gates: Vec<Gate>,
    slo: Option<(String, Vec<Slo>)>,
    baseline: Option<serde_json::Value>,
    join: Option<AdminUrl>,
}

/// A run that never took place: why, the gates it would have checked, and its configuration when
/// that much was valid (for the reports' `meta`; boxed, as it is large and rarely there).
struct Aborted {
    failure: RunFailure,
    gates: Vec<Gate>,
    config: Option<Box<ProbeConfig>>,
}

/// One run measured: its streams, its report, and what it leaves for the report files.
struct Measured {
    run: ProbeRun,
    report: Report,
    /// The run ended early: its first streams all failed.
    gave_up: bool,
    /// `--gaps-csv`'s rows.
    gap_rows: Option<Vec<GapRow>>,
}

/// Entry point of the `probe` subcommand.
pub async fn run(mut args: ProbeArgs) -> ExitCode {
    if let Some(ProbeCommand::Compare { a, b }) = &args.command {
        return compare(a, b);
    }
    let outcome = match execute(&mut args).await {
        Ok(outcome) => outcome,
        Err(aborted) => aborted.into_outcome(&args),
    };
    let status = Status::of(&outcome.judged);
    // A refused command line keeps stdout empty: the error on stderr says it all.
    if status != Status::Usage {
        print!("{}", report_text::render_result(&outcome.judged));
    }
    explain_failures(&outcome.judged);
    match reports::write_all(&args.output, &outcome) {
        Ok(()) => ExitCode::from(status.exit_code()),
        Err(e) => usage(&e),
    }
}

/// Plans, finds the model, measures every run (one, or one per rate) and prints each report as it
/// is done.
async fn execute(args: &mut ProbeArgs) -> Result<Outcome, Aborted> {
    // Every usage error is found before the first request, the model list's included.
    let plan = plan(args)?;
    if args.request.model.is_none() && args.request.body.is_none() {
        let model = find_model(args, &plan.gates).await?;
        args.request.model = Some(model);
    }
    let config =
        ProbeConfig::try_from(&*args).map_err(|e| Aborted::usage(&e, &plan.gates, None))?;
    if let Some(limit) = limits::raise_open_file_limit() {
        tracing::debug!(limit, "open-file limit");
    }
    let configs = sweep(args, config);
    let mut judged = Vec::new();
    let mut last = None;
    for (label, config) in &configs {
        let measured = measure_one(args, config, label.as_deref(), &plan)
            .await
            .map_err(|e| Aborted::usage(&e, &plan.gates, Some(config.clone())))?;
        let outcomes = evaluate(&plan.gates, &measured.report, plan.baseline.as_ref());
        println!("metronome probe: {}", describe(config));
        print!("{}", render_text(&measured.report));
        let max_error_rate = args.output.max_error_rate;
        judged.push(Judged::measured(
            label.clone(),
            measured.report,
            outcomes,
            max_error_rate,
            measured.gave_up,
        ));
        last = Some((measured.run, measured.gap_rows));
    }
    if judged.len() > 1 {
        print!("{}", report_text::render_sweep(&judged));
    }
    let baseline_table = baseline_table(args, &plan, &judged);
    let (run, gap_rows) = last.unwrap_or_else(|| (empty_run(), None));
    Ok(Outcome {
        judged,
        run,
        describe: describe(&configs[0].1),
        baseline_table,
        gap_rows,
    })
}

/// The configurations to run: `config` alone, or one open loop per rate of `--rate-sweep`.
fn sweep(args: &ProbeArgs, config: ProbeConfig) -> Vec<(Option<String>, ProbeConfig)> {
    if args.load.rate_sweep.is_empty() {
        return vec![(None, config)];
    }
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
}

/// Asks the server's `/v1/models` for the model to use (a failed run, exit 3, when it cannot
/// say).
async fn find_model(args: &ProbeArgs, gates: &[Gate]) -> Result<String, Aborted> {
    let mut probe_args = args.clone();
    probe_args.request.model = Some(String::new());
    let mut config =
        ProbeConfig::try_from(&probe_args).map_err(|e| Aborted::usage(&e, gates, None))?;
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
            config.model = None;
            Err(Aborted {
                failure: RunFailure {
                    kind: FailureKind::Discovery,
                    message: "no --model given, and none could be found".to_owned(),
                    causes: vec![e.to_string()],
                },
                gates: gates.to_vec(),
                config: Some(Box::new(config)),
            })
        }
    }
}

/// Parses the gates, the objectives, the baseline and the join URL (usage errors, exit 2).
fn plan(args: &ProbeArgs) -> Result<Plan, Aborted> {
    let gates = parse_gates(&args.output.gates).map_err(|e| Aborted::usage(&e, &[], None))?;
    let refused = |e: &dyn std::fmt::Display| Aborted::usage(e, &gates, None);
    gates::check_baseline(&gates, args.output.baseline.is_some()).map_err(|e| refused(&e))?;
    let slo = match &args.output.slo {
        Some(text) => Some((
            text.clone(),
            goodput::parse_slo(text).map_err(|e| refused(&e))?,
        )),
        None => None,
    };
    let baseline = match &args.output.baseline {
        Some(path) => Some(baseline::load(path).map_err(|e| refused(&e))?),
        None => None,
    };
    let join = match args.output.join.as_deref().map(AdminUrl::parse).transpose() {
        Ok(join) => join,
        Err(e) => return Err(refused(&e)),
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
) -> Result<Measured, ProbeError> {
    let label = label.map(|l| format!(" ({l})")).unwrap_or_default();
    let progress = Progress::start(config.stop, args.output.progress_interval, label);
    let started = SystemTime::now();
    let starts = progress.starts.clone();
    let run = measure_counting(config, starts.clone(), |s| progress.stream_ended(s)).await?;
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
    let keep_rows = args.output.gaps_csv.is_some();
    let mut gap_rows = None;
    // clap requires --join for --gaps-csv; without it the rows are not kept (about 40 bytes a
    // gap).
    if let Some(admin) = &plan.join {
        let (attribution, rows) =
            attribute_run_judged(admin, &run, config.stall_threshold, keep_rows).await;
        report.attribution = Some(attribution);
        gap_rows = keep_rows.then_some(rows);
    }
    Ok(Measured {
        run,
        report,
        gave_up: starts.gave_up(),
        gap_rows,
    })
}

/// The comparison with `--baseline`, printed, and as Markdown for the summary; a warning first
/// when the two runs' workloads differ.
fn baseline_table(args: &ProbeArgs, plan: &Plan, judged: &[Judged]) -> Option<String> {
    let before = plan.baseline.as_ref()?;
    let now = serde_json::to_value(&judged.first()?.report).ok()?;
    let rows = baseline::deltas(before, &now);
    let name = baseline::short_name(args.output.baseline.as_deref()?);
    let differences = baseline::workload_differences(before, &now);
    let warning = baseline::workload_warning(&name, "this run", &differences);
    if let Some(warning) = &warning {
        eprintln!("warning: {warning}");
    }
    println!("against the baseline {name}:");
    print!("{}", baseline::render_text("baseline", "this run", &rows));
    let mut table = warning
        .map(|w| format!("> **Warning:** {w}\n\n"))
        .unwrap_or_default();
    table.push_str(&baseline::render_markdown("baseline", "this run", &rows));
    Some(table)
}

/// On stderr, why each measured run failed and what its streams' errors said.
fn explain_failures(judged: &[Judged]) {
    for run in judged {
        let Some(failure) = &run.run_failure else {
            continue;
        };
        // A refused command line or a missing model was said when it was found.
        if matches!(failure.kind, FailureKind::Usage | FailureKind::Discovery) {
            continue;
        }
        let prefix = run
            .label
            .as_ref()
            .map(|l| format!("[{l}] "))
            .unwrap_or_default();
        eprintln!("error: {prefix}the run failed: {}", failure.message);
        for cause in &failure.causes {
            eprintln!("  {cause}");
        }
    }
}

// === impl Aborted ===

impl Aborted {
    /// A usage error: said on stderr now, and kept for the reports.
    fn usage(error: &dyn std::fmt::Display, gates: &[Gate], config: Option<ProbeConfig>) -> Self {
        eprintln!("error: {error}");
        Aborted {
            failure: RunFailure {
                kind: FailureKind::Usage,
                message: error.to_string(),
                causes: Vec::new(),
            },
            gates: gates.to_vec(),
            config: config.map(Box::new),
        }
    }

    /// What the reports say of a run that never took place: no streams, each gate not measured,
    /// the failure, and the metadata when the configuration was valid.
    fn into_outcome(self, args: &ProbeArgs) -> Outcome {
        let run = empty_run();
        let threshold = args.output.stall_threshold;
        let mut report = summarize(&run, threshold);
        report.meta = self
            .config
            .as_ref()
            .map(|c| meta::run_meta(c, SystemTime::now(), Duration::ZERO));
        let describe = match &self.config {
            Some(config) => describe(config),
            None => args.url.clone().unwrap_or_default(),
        };
        Outcome {
            judged: vec![Judged::aborted(report, &self.gates, self.failure)],
            run,
            describe,
            baseline_table: None,
            gap_rows: None,
        }
    }
}

/// A run with no stream.
fn empty_run() -> ProbeRun {
    let now = Instant::now();
    ProbeRun {
        started: now,
        finished: now,
        streams: Vec::new(),
    }
}

/// `metronome probe compare A.json B.json`: the two reports side by side (exit 0, or 2 when one
/// cannot be read), with a warning when their workloads differ.
fn compare(a: &Path, b: &Path) -> ExitCode {
    let (left, right) = match (baseline::load(a), baseline::load(b)) {
        (Ok(left), Ok(right)) => (left, right),
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    let (a_name, b_name) = (baseline::short_name(a), baseline::short_name(b));
    let differences = baseline::workload_differences(&left, &right);
    if let Some(warning) = baseline::workload_warning(&a_name, &b_name, &differences) {
        eprintln!("warning: {warning}");
    }
    let rows = baseline::deltas(&left, &right);
    print!("{}", baseline::render_text(&a_name, &b_name, &rows));
    ExitCode::SUCCESS
}

fn usage(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(judged::USAGE)
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
