//! From stream records to the report: percentiles, stalls, jank, reading speed and the verdict.
//!
//! Conventions, so the numbers can be checked by hand:
//! - **Percentiles are nearest-rank on the exact sorted samples**: the p-th percentile of n samples
//!   is the sample of rank ⌈p·n/100⌉ (1-based), so it is always a value that was measured; p100 is
//!   the maximum.
//! - **No data is `null`** in JSON (`None` here) and `-` in text: a percentile of no samples, a
//!   stall share of no gaps, a band share of no streams. Nothing is reported as 0 for lack of data.
//! - **Timing uses every token event that arrived**, also from streams that later failed: a stream
//!   that stalls and then times out still shows its gaps. The failure itself counts in `errors`.
//! - **ITL** pools every gap of every stream (a gap inside one frame is 0 and is kept).
//! - **tokens/s** is per stream: (output tokens − 1) / (last token event − first token event),
//!   with output tokens from `usage` when the server reported them, else counted; streams where it
//!   is undefined (under two tokens, or all token events in one frame) are left out.
//! - **stall_pct** is the percentage (0–100) of pooled gaps strictly longer than the threshold;
//!   **stalled_streams_pct** the percentage of streams with a gap that had at least one.
//! - **jank_ratio** is pooled p99 gap / max(pooled p50 gap, 1 ms); **stream_jank_ratio** is the
//!   same ratio per stream, over streams with at least 8 gaps.
//! - **verdict** is taken per stream, from the stalled streams, the per-stream jank ratio and
//!   the median tokens/s ([`super::verdict::RULE`]); JANKY when any is missing: smoothness is
//!   never claimed without data.
//! - **reading_bands** are shares (0–1) of the streams with a defined tokens/s, by band:
//!   `[0, 5)`, `[5, 7)`, `[7, 15)`, `[15, 50)`, `[50, ∞)`.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use super::attribution::Attribution;
use super::client::ProbeRun;
use super::goodput::Goodput;
use super::stream::{Phase, StreamError, StreamRecord};
use super::verdict::{Evidence, Verdict};
use super::workload::RequestShape;

/// Streams need at least this many gaps for a per-stream jank ratio (docs/design.md section 3).
pub const MIN_GAPS_FOR_STREAM_JANK: usize = 8;

/// The jank ratio's floor for the median gap, so a stream of clumps does not divide by zero.
pub const JANK_FLOOR: Duration = Duration::from_millis(1);

/// The probe's findings. Serializes to exactly the keys of the JSON contract; [`ReportDetail`]
/// carries what the text and HTML reports show beyond it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Streams started.
    pub requests: u64,
    /// Streams that failed (connect, status, body, timeout, no token event, error event).
    pub errors: u64,
    /// Time to first token (from the intended start), in milliseconds.
    pub ttft_ms: Quantiles,
    /// Time to first output token (the first token event that is not reasoning, from the
    /// intended start), in milliseconds; a stream that never got past its reasoning has none.
    pub ttfo_ms: Quantiles,
    /// Inter-token gaps, pooled over all streams, in milliseconds.
    pub itl_ms: Quantiles,
    /// Per-stream reading speed.
    pub tokens_per_second: TokensPerSecond,
    /// Percentage (0–100) of gaps longer than the stall threshold.
    pub stall_pct: Option<f64>,
    /// Percentage (0–100) of the streams with a gap that had at least one stall: how many
    /// readers saw the text stop.
    pub stalled_streams_pct: Option<f64>,
    /// Pooled p99 gap / max(pooled p50 gap, 1 ms).
    pub jank_ratio: Option<f64>,
    /// Per-stream jank ratio, over streams with at least 8 gaps.
    pub stream_jank_ratio: StreamJank,
    /// SMOOTH or JANKY, by [`super::verdict::RULE`].
    pub verdict: Verdict,
    /// Share of streams in each reading-speed band.
    pub reading_bands: ReadingBands,
    /// Per-phase figures (reasoning, content, tool_call) over the streams that say the phase of
    /// each token event (WebSocket runs); absent otherwise, so the other keys stay as they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<BTreeMap<&'static str, PhaseFigures>>,
    /// Where the client's gaps come from (`--join` only; absent otherwise, so the other keys
    /// stay as they are).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Attribution>,
    /// Completed streams and output tokens per second of the run's wall time.
    pub throughput: Throughput,
    /// The share of streams meeting `--slo` (absent without `--slo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Goodput>,
    /// What was run, where and when (set by the command; absent from library runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<RunMeta>,
    /// Context for the human-readable reports; not part of the JSON contract.
    #[serde(skip)]
    pub detail: ReportDetail,
}

/// One phase's figures (docs/design.md section 3: a gap belongs to the phase of the event that ends
/// it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// Token events of the phase.
    pub token_events: u64,
    /// Per stream, the intended start to the phase's first token event, in milliseconds (for
    /// content, the time to the first answer token).
    pub first_ms: Quantiles,
    /// The gaps that end at a token event of the phase, pooled, in milliseconds.
    pub itl_ms: Quantiles,
    /// Of those gaps, the ones longer than the stall threshold.
    pub stalls: u64,
}

/// The run's throughput, over its wall time (first start to last end), as vllm bench serve
/// reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Streams that completed without error, per second.
    pub requests_per_second: Option<f64>,
    /// Output tokens (of every stream) per second.
    pub output_tokens_per_second: Option<f64>,
}

/// The run's metadata: the JSON `meta` section, so a report says what produced it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunMeta {
    /// metronome's version.
    pub version: &'static str,
    /// The command line, as given (request headers are not part of it unless the user typed
    /// them; `--header` values are shown as `Name: ...`).
    pub command_line: Vec<String>,
    /// The URL probed.
    pub url: String,
    /// The model asked for (`null` with `--body`).
    pub model: Option<String>,
    /// `closed` or `open`.
    pub load: &'static str,
    /// Closed loop: streams in flight; open loop: the cap, if any.
    pub concurrency: Option<usize>,
    /// Open loop: streams started per second.
    pub rate: Option<f64>,
    /// When the run started, RFC 3339 in UTC.
    pub started: String,
    /// The run's wall time in seconds.
    pub duration_s: f64,
    /// What the run asked of the server, beyond the load above.
    pub workload: Workload,
}

/// What a run asked of the server beyond its load: `meta.workload`. `--baseline` and `probe
/// compare` warn when two runs differ here (or in load, concurrency or rate).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// `--requests` (`null` with `--duration`).
    pub requests: Option<u64>,
    /// `--duration` in seconds (`null` with `--requests`).
    pub duration_s: Option<f64>,
    /// What each request asks for.
    #[serde(flatten)]
    pub request: RequestShape,
    /// The requests in `--dataset` (`null` without).
    pub dataset_requests: Option<usize>,
    /// `--seed` (`null`: the dataset in order).
    pub seed: Option<u64>,
    /// Whether the streams spoke HTTP/2.
    pub http2: bool,
    /// `--stall-threshold` in milliseconds: the figures on stalls depend on it.
    pub stall_threshold_ms: f64,
}

/// p50, p95, p99 and max of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

/// The median and the slow tail (p5) of per-stream tokens/s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TokensPerSecond {
    /// Median stream.
    pub p50: Option<f64>,
    /// The stream slower than 95% of the others: what the unluckiest readers get.
    pub p5: Option<f64>,
}

/// Percentiles of the per-stream jank ratio.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StreamJank {
    /// Median stream.
    pub p50: Option<f64>,
    /// 95th percentile stream.
    pub p95: Option<f64>,
}

/// Share (0–1) of streams per tokens/s band: below reading speed, around it, comfortable, fast,
/// faster than anyone reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReadingBands {
    /// Under 5 tokens/s.
    pub below_5: Option<f64>,
    /// 5 up to 7 tokens/s.
    #[serde(rename = "5_to_7")]
    pub from_5_to_7: Option<f64>,
    /// 7 up to 15 tokens/s.
    #[serde(rename = "7_to_15")]
    pub from_7_to_15: Option<f64>,
    /// 15 up to 50 tokens/s.
    #[serde(rename = "15_to_50")]
    pub from_15_to_50: Option<f64>,
    /// 50 tokens/s and more.
    pub above_50: Option<f64>,
}

/// What the human-readable reports show beyond the JSON contract.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportDetail {
    /// The stall threshold the report was computed with.
    pub stall_threshold: Duration,
    /// Gaps pooled into `itl_ms`.
    pub gaps: u64,
    /// Gaps longer than the threshold.
    pub stalls: u64,
    /// Streams with at least one gap.
    pub streams_with_gaps: u64,
    /// Of those, streams with at least one stall.
    pub stalled_streams: u64,
    /// Gaps of 0 (token events that shared a frame).
    pub clumped_gaps: u64,
    /// Token events received.
    pub token_events: u64,
    /// Output tokens over all streams.
    pub output_tokens: u64,
    /// Streams with a defined tokens/s.
    pub streams_with_tps: u64,
    /// Streams with at least 8 gaps.
    pub streams_with_jank: u64,
    /// Errors by kind (`connect`, `status`, `timeout`, ...).
    pub errors_by_kind: BTreeMap<&'static str, u64>,
    /// The first error message of each kind, so the report says why streams failed.
    pub error_examples: BTreeMap<&'static str, String>,
    /// From the first start to the last stream's end.
    pub wall_time: Duration,
    /// ITL at p50, p99, p99.9 and max (the tail a benchmark compares).
    pub itl_tail: Tail,
    /// TTFT at p50, p99, p99.9 and max.
    pub ttft_tail: Tail,
}

/// p50, p99, p99.9 and max of a set of durations, exact (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tail {
    /// Median.
    pub p50: Option<Duration>,
    /// 99th percentile.
    pub p99: Option<Duration>,
    /// 99.9th percentile.
    pub p999: Option<Duration>,
    /// Largest sample.
    pub max: Option<Duration>,
}

// === impl Tail ===

impl Tail {
    fn of(sorted: &[Duration]) -> Self {
        Tail {
            p50: nearest_rank(sorted, 50),
            p99: nearest_rank(sorted, 99),
            p999: nearest_rank_per_mille(sorted, 999),
            max: nearest_rank(sorted, 100),
        }
    }
}

/// Computes the report of a run. Gaps above `stall_threshold` are stalls.
pub fn summarize(run: &ProbeRun, stall_threshold: Duration) -> Report {
    let mut ttfts = Vec::with_capacity(run.streams.len());
    let mut gaps = Vec::new();
    let mut tps = Vec::new();
    let mut stream_janks = Vec::new();
    let mut detail = ReportDetail {
        stall_threshold,
        wall_time: run.finished.saturating_duration_since(run.started),
        ..ReportDetail::default()
    };
    let mut errors = 0;
    let mut explained = BTreeSet::new();
    let mut stream_gaps = Vec::new();
    for stream in &run.streams {
        if let Some(error) = &stream.error {
            errors += 1;
            tally_error(
                &mut detail,
                &mut explained,
                error,
                stream.error_body.as_deref(),
            );
        }
        ttfts.extend(stream.ttft());
        stream_gaps.clear();
        stream_gaps.extend(stream.gaps());
        gaps.extend_from_slice(&stream_gaps);
        if !stream_gaps.is_empty() {
            detail.streams_with_gaps += 1;
            detail.stalled_streams += u64::from(stream_gaps.iter().any(|g| *g > stall_threshold));
        }
        if stream_gaps.len() >= MIN_GAPS_FOR_STREAM_JANK {
            stream_gaps.sort_unstable();
            stream_janks.extend(jank(&stream_gaps));
        }
        tps.extend(stream.tokens_per_second());
        detail.token_events += stream.token_times.len() as u64;
        detail.output_tokens += stream.output_tokens();
    }
    ttfts.sort_unstable();
    gaps.sort_unstable();
    tps.sort_unstable_by(f64::total_cmp);
    stream_janks.sort_unstable_by(f64::total_cmp);

    detail.gaps = gaps.len() as u64;
    detail.stalls = gaps.iter().filter(|g| **g > stall_threshold).count() as u64;
    detail.clumped_gaps = gaps.iter().take_while(|g| g.is_zero()).count() as u64;
    detail.streams_with_tps = tps.len() as u64;
    detail.itl_tail = Tail::of(&gaps);
    detail.ttft_tail = Tail::of(&ttfts);
    detail.streams_with_jank = stream_janks.len() as u64;

    let tokens_per_second = TokensPerSecond {
        p50: nearest_rank(&tps, 50),
        p5: nearest_rank(&tps, 5),
    };
    let jank_ratio = jank(&gaps);
    let stream_jank_ratio = StreamJank {
        p50: nearest_rank(&stream_janks, 50),
        p95: nearest_rank(&stream_janks, 95),
    };
    let stalled_streams_pct =
        share(detail.stalled_streams, detail.streams_with_gaps).map(|s| s * 100.0);
    let evidence = Evidence {
        stalled_streams_pct,
        stream_jank_p95: stream_jank_ratio.p95,
        tps_p50: tokens_per_second.p50,
    };
    let seconds = detail.wall_time.as_secs_f64();
    let per_second = |n: u64| (seconds > 0.0).then(|| n as f64 / seconds);
    let throughput = Throughput {
        requests_per_second: per_second(run.streams.len() as u64 - errors),
        output_tokens_per_second: per_second(detail.output_tokens),
    };
    Report {
        phases: phase_figures(run, stall_threshold),
        requests: run.streams.len() as u64,
        errors,
        ttft_ms: quantiles_ms(&ttfts),
        ttfo_ms: quantiles_ms(&ttfos(run)),
        itl_ms: quantiles_ms(&gaps),
        tokens_per_second,
        stall_pct: share(detail.stalls, detail.gaps).map(|s| s * 100.0),
        stalled_streams_pct,
        jank_ratio,
        stream_jank_ratio,
        verdict: evidence.verdict(),
        reading_bands: reading_bands(&tps),
        attribution: None,
        throughput,
        goodput: None,
        meta: None,
        detail,
    }
}

/// Counts a failed stream's `error` (with the start of the server's `body`, if any) by kind.
/// The first error of each kind is its example, unless a later one says why where the first did
/// not; `explained` holds the kinds whose example does.
fn tally_error(
    detail: &mut ReportDetail,
    explained: &mut BTreeSet<&'static str>,
    error: &StreamError,
    body: Option<&str>,
) {
    *detail.errors_by_kind.entry(error.kind()).or_default() += 1;
    let kind = error.kind();
    let example = match body {
        Some(body) => format!("{error}: {body}"),
        None => error.to_string(),
    };
    match detail.error_examples.entry(kind) {
        Entry::Vacant(slot) => {
            slot.insert(example);
            if error.explains() {
                explained.insert(kind);
            }
        }
        Entry::Occupied(mut slot) => {
            if error.explains() && explained.insert(kind) {
                slot.insert(example);
            }
        }
    }
}

/// Each stream's TTFO (intended start to its first token event that is not reasoning), sorted;
/// a stream that does not say its phases counts its first token event.
fn ttfos(run: &ProbeRun) -> Vec<Duration> {
    let mut out: Vec<Duration> = run
        .streams
        .iter()
        .filter_map(|stream| {
            let first_output = match stream.phased_tokens() {
                Some(mut tokens) => tokens
                    .find(|(_, p)| *p != Phase::Reasoning)
                    .map(|(at, _)| at),
                None => stream.token_times.first().copied(),
            }?;
            Some(first_output.saturating_duration_since(stream.scheduled))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Per-phase figures over the streams that say the phase of each token event; `None` when none
/// does.
fn phase_figures(
    run: &ProbeRun,
    stall_threshold: Duration,
) -> Option<BTreeMap<&'static str, PhaseFigures>> {
    let mut firsts: BTreeMap<Phase, Vec<Duration>> = BTreeMap::new();
    let mut gaps: BTreeMap<Phase, Vec<Duration>> = BTreeMap::new();
    let mut any = false;
    for stream in &run.streams {
        let Some(tokens) = stream.phased_tokens() else {
            continue;
        };
        any = true;
        let mut seen = BTreeSet::new();
        let mut previous = None;
        for (at, phase) in tokens {
            if seen.insert(phase) {
                let first = at.saturating_duration_since(stream.scheduled);
                firsts.entry(phase).or_default().push(first);
            }
            let phase_gaps = gaps.entry(phase).or_default();
            if let Some(previous) = previous {
                phase_gaps.push(at.saturating_duration_since(previous));
            }
            previous = Some(at);
        }
    }
    if !any {
        return None;
    }
    let mut figures = BTreeMap::new();
    for phase in Phase::ALL {
        let (Some(mut first), mut phase_gaps) = (
            firsts.remove(&phase),
            gaps.remove(&phase).unwrap_or_default(),
        ) else {
            continue;
        };
        first.sort_unstable();
        phase_gaps.sort_unstable();
        let stalls = phase_gaps.iter().filter(|g| **g > stall_threshold).count();
        let token_events = run
            .streams
            .iter()
            .filter_map(StreamRecord::phased_tokens)
            .map(|tokens| tokens.filter(|(_, p)| *p == phase).count() as u64)
            .sum();
        figures.insert(
            phase.as_str(),
            PhaseFigures {
                token_events,
                first_ms: quantiles_ms(&first),
                itl_ms: quantiles_ms(&phase_gaps),
                stalls: stalls as u64,
            },
        );
    }
    Some(figures)
}

/// The nearest-rank percentile of `sorted` (ascending): the sample of rank ⌈percent·n/100⌉,
/// the first sample for percent 0. `None` for no samples.
pub fn nearest_rank<T: Copy>(sorted: &[T], percent: u32) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let percent = percent.min(100) as usize;
    let rank = (percent * n).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// Like [`nearest_rank`] in thousandths: the sample of rank ⌈per_mille·n/1000⌉ (p99.9 is 999).
pub fn nearest_rank_per_mille<T: Copy>(sorted: &[T], per_mille: u32) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let per_mille = per_mille.min(1000) as usize;
    let rank = (per_mille * n).div_ceil(1000).max(1);
    sorted.get(rank - 1).copied()
}

/// p99 / max(p50, 1 ms) of sorted gaps; `None` for no gaps.
pub fn jank(sorted_gaps: &[Duration]) -> Option<f64> {
    let p50 = nearest_rank(sorted_gaps, 50)?;
    let p99 = nearest_rank(sorted_gaps, 99)?;
    Some(p99.as_secs_f64() / p50.max(JANK_FLOOR).as_secs_f64())
}

// === impl Report ===

impl Report {
    /// The figures the verdict was taken from, for a report that says why.
    pub fn evidence(&self) -> Evidence {
        Evidence {
            stalled_streams_pct: self.stalled_streams_pct,
            stream_jank_p95: self.stream_jank_ratio.p95,
            tps_p50: self.tokens_per_second.p50,
        }
    }
}

/// Shares of the tokens/s values in each reading band; all `None` for no values.
pub fn reading_bands(tps: &[f64]) -> ReadingBands {
    let total = tps.len() as u64;
    let count = |low: f64, high: f64| tps.iter().filter(|t| **t >= low && **t < high).count();
    let band = |low, high| share(count(low, high) as u64, total);
    ReadingBands {
        below_5: band(f64::NEG_INFINITY, 5.0),
        from_5_to_7: band(5.0, 7.0),
        from_7_to_15: band(7.0, 15.0),
        from_15_to_50: band(15.0, 50.0),
        above_50: band(50.0, f64::INFINITY),
    }
}

fn quantiles_ms(sorted: &[Duration]) -> Quantiles {
    let ms = |percent| nearest_rank(sorted, percent).map(millis);
    Quantiles {
        p50: ms(50),
        p95: ms(95),
        p99: ms(99),
        max: ms(100),
    }
}

/// The figures beyond the JSON contract, for `--detail FILE`: the tails a benchmark compares
/// (in microseconds, to the nanosecond), counts, and errors by kind.
pub fn detail_json(report: &Report) -> serde_json::Value {
    let us = |d: Option<Duration>| d.map(|d| d.as_nanos() as f64 / 1e3);
    let tail = |t: &Tail| {
        serde_json::json!({
            "p50": us(t.p50),
            "p99": us(t.p99),
            "p999": us(t.p999),
            "max": us(t.max),
        })
    };
    let d = &report.detail;
    serde_json::json!({
        "requests": report.requests,
        "errors": report.errors,
        "errors_by_kind": d.errors_by_kind,
        "error_examples": d.error_examples,
        "token_events": d.token_events,
        "gaps": d.gaps,
        "clumped_gaps": d.clumped_gaps,
        "wall_time_s": d.wall_time.as_secs_f64(),
        "itl_us": tail(&d.itl_tail),
        "ttft_us": tail(&d.ttft_tail),
    })
}

/// Milliseconds, rounded to the microsecond (finer is below what the clock and the OS resolve).
pub fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn share(part: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| part as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::probe::stream::{Phase, StreamError, StreamRecord};

    use crate::units::ms;

    /// A stream whose token events arrive after the given gaps (first token at `ttft`).
    #[test]
    fn phases_split_first_events_gaps_and_stalls_by_the_event_that_ends_each_gap() {
        let t0 = Instant::now();
        // Reasoning at 10, 20, 30 ms; content at 330 (a 300 ms think pause) and 340; one tool
        // call event at 350.
        let mut phased = stream(0, t0, ms(10), &[ms(10), ms(10), ms(300), ms(10), ms(10)]);
        phased.token_phases = vec![
            Phase::Reasoning,
            Phase::Reasoning,
            Phase::Reasoning,
            Phase::Content,
            Phase::Content,
            Phase::ToolCall,
        ];
        let unphased = stream(1, t0, ms(5), &[ms(5)]);
        let run = ProbeRun {
            started: t0,
            finished: t0 + ms(400),
            streams: vec![phased, unphased],
        };
        let phases = summarize(&run, ms(200)).phases.unwrap();
        let reasoning = &phases["reasoning"];
        assert_eq!(reasoning.token_events, 3);
        assert_eq!(reasoning.first_ms.p50, Some(10.0));
        assert_eq!(reasoning.itl_ms.max, Some(10.0));
        let content = &phases["content"];
        assert_eq!(content.token_events, 2);
        assert_eq!(
            content.first_ms.p50,
            Some(330.0),
            "the time to the first answer token"
        );
        assert_eq!((content.itl_ms.max, content.stalls), (Some(300.0), 1));
        assert_eq!(phases["tool_call"].token_events, 1);
        let without = ProbeRun {
            streams: vec![stream(0, t0, ms(5), &[ms(5)])],
            ..run
        };
        assert!(summarize(&without, ms(200)).phases.is_none());
    }

    fn stream(index: u64, t0: Instant, ttft: Duration, gaps: &[Duration]) -> StreamRecord {
        let mut record = StreamRecord::new(index, t0);
        let mut at = t0 + ttft;
        record.token_times.push(at);
        for gap in gaps {
            at += *gap;
            record.token_times.push(at);
        }
        record.counted_tokens = record.token_times.len() as u64;
        record.finished = Some(at);
        record
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), Some(50));
        assert_eq!(nearest_rank(&v, 95), Some(95));
        assert_eq!(nearest_rank(&v, 99), Some(99));
        assert_eq!(nearest_rank(&v, 100), Some(100));
        assert_eq!(nearest_rank(&v, 0), Some(1));
        let v = [10, 20, 30, 40];
        // ⌈0.5·4⌉ = 2, ⌈0.95·4⌉ = 4, ⌈0.05·4⌉ = 1.
        assert_eq!(nearest_rank(&v, 50), Some(20));
        assert_eq!(nearest_rank(&v, 95), Some(40));
        assert_eq!(nearest_rank(&v, 5), Some(10));
        assert_eq!(nearest_rank(&[7], 99), Some(7));
        assert_eq!(nearest_rank::<u32>(&[], 50), None);
        let v: Vec<u32> = (1..=2000).collect();
        assert_eq!(nearest_rank_per_mille(&v, 999), Some(1998));
        assert_eq!(nearest_rank_per_mille(&v, 1000), Some(2000));
        assert_eq!(nearest_rank_per_mille(&[7], 999), Some(7));
        assert_eq!(nearest_rank_per_mille::<u32>(&[], 999), None);
    }

    #[test]
    fn jank_ratio_floors_the_median_at_one_millisecond() {
        let mut gaps = vec![ms(30); 99];
        gaps.push(ms(300));
        gaps.sort();
        // p99 of 100 gaps is rank 99: still 30 ms.
        assert_eq!(jank(&gaps), Some(1.0));
        gaps.extend([ms(300); 2]);
        gaps.sort();
        assert!((jank(&gaps).unwrap() - 10.0).abs() < 1e-12);
        // All clumps: p50 is 0, the floor makes it 1 ms.
        let clumps = [Duration::ZERO, Duration::ZERO, ms(5)];
        assert!((jank(&clumps).unwrap() - 5.0).abs() < 1e-12);
        assert_eq!(jank(&[]), None);
    }

    #[test]
    fn bands_split_at_their_lower_edges() {
        let bands = reading_bands(&[1.0, 5.0, 6.9, 7.0, 14.0, 15.0, 49.9, 50.0, 500.0, 4.99]);
        assert_eq!(bands.below_5, Some(0.2));
        assert_eq!(bands.from_5_to_7, Some(0.2));
        assert_eq!(bands.from_7_to_15, Some(0.2));
        assert_eq!(bands.from_15_to_50, Some(0.2));
        assert_eq!(bands.above_50, Some(0.2));
        assert_eq!(reading_bands(&[]), ReadingBands::default());
    }

    #[test]
    fn half_the_streams_frozen_once_is_janky_though_under_1_pct_of_gaps_stalled() {
        let t0 = Instant::now();
        let steady = vec![ms(20); 200];
        let mut frozen = steady.clone();
        frozen[100] = ms(300);
        let streams = (0..10)
            .map(|i| {
                let gaps = if i % 2 == 0 { &frozen } else { &steady };
                stream(i, t0, ms(50), gaps)
            })
            .collect();
        let run = ProbeRun {
            started: t0,
            finished: t0 + ms(5000),
            streams,
        };
        let report = summarize(&run, ms(200));
        // 5 stalls among 2000 gaps, and the pooled p99 is a steady gap: the old rule's SMOOTH.
        assert!((report.stall_pct.unwrap() - 0.25).abs() < 1e-9);
        assert!(report.jank_ratio.unwrap() < 4.0);
        assert_eq!(report.stalled_streams_pct, Some(50.0));
        assert_eq!(
            (
                report.detail.stalled_streams,
                report.detail.streams_with_gaps
            ),
            (5, 10)
        );
        assert_eq!(report.verdict, Verdict::Janky);
        // The same streams without the freezes are smooth.
        let run = ProbeRun {
            started: t0,
            finished: t0 + ms(5000),
            streams: (0..10).map(|i| stream(i, t0, ms(50), &steady)).collect(),
        };
        let report = summarize(&run, ms(200));
        assert_eq!(report.stalled_streams_pct, Some(0.0));
        assert_eq!(report.verdict, Verdict::Smooth);
    }

    #[test]
    fn an_error_that_says_why_is_its_kinds_example() {
        let t0 = Instant::now();
        let errors = [
            StreamError::ConnectCanceled("request was canceled".into()),
            StreamError::Connect("connection refused".into()),
            StreamError::Connect("connection reset".into()),
            StreamError::Status(502),
            StreamError::Status(503),
        ];
        let streams = errors
            .into_iter()
            .enumerate()
            .map(|(i, error)| {
                let mut failed = StreamRecord::new(i as u64, t0);
                failed.error = Some(error);
                failed
            })
            .collect();
        let run = ProbeRun {
            started: t0,
            finished: t0 + ms(100),
            streams,
        };
        let report = summarize(&run, ms(200));
        assert_eq!(report.detail.errors_by_kind.get("connect"), Some(&3));
        let examples = &report.detail.error_examples;
        assert_eq!(examples["connect"], "could not connect: connection refused");
        assert_eq!(examples["status"], "the server answered with status 502");
    }

    #[test]
    fn summary_of_steady_streams_with_one_stall_each() {
        let t0 = Instant::now();
        let mut gaps = vec![ms(30); 39];
        gaps[19] = ms(330);
        let mut streams: Vec<_> = (0..3).map(|i| stream(i, t0, ms(50), &gaps)).collect();
        let mut failed = StreamRecord::new(3, t0);
        failed.error = Some(StreamError::Status(503));
        streams.push(failed);
        let run = ProbeRun {
            started: t0,
            finished: t0 + ms(2000),
            streams,
        };
        let report = summarize(&run, ms(200));
        assert_eq!(report.requests, 4);
        assert_eq!(report.errors, 1);
        assert_eq!(report.detail.errors_by_kind.get("status"), Some(&1));
        assert_eq!(
            report
                .detail
                .error_examples
                .get("status")
                .map(String::as_str),
            Some("the server answered with status 503")
        );
        assert_eq!(report.detail.gaps, 117);
        assert_eq!(report.detail.stalls, 3);
        assert!((report.stall_pct.unwrap() - 100.0 / 39.0).abs() < 1e-9);
        assert_eq!(report.ttft_ms.p50, Some(50.0));
        assert_eq!(report.itl_ms.p50, Some(30.0));
        // 3 stalls of 117 gaps: p99 (rank 116) is a stall.
        assert_eq!(report.itl_ms.p99, Some(330.0));
        assert_eq!(report.itl_ms.max, Some(330.0));
        assert!((report.jank_ratio.unwrap() - 11.0).abs() < 1e-9);
        // Per stream, 39 gaps: p99 is rank 39, the stall.
        assert!((report.stream_jank_ratio.p50.unwrap() - 11.0).abs() < 1e-9);
        // 39 tokens over 39·30 + 300 ms.
        let tps = 39.0 / 1.47;
        assert!((report.tokens_per_second.p50.unwrap() - tps).abs() < 1e-9);
        assert_eq!(report.reading_bands.from_15_to_50, Some(1.0));
        assert_eq!(report.verdict, Verdict::Janky);
    }

    #[test]
    fn no_data_is_none() {
        let t0 = Instant::now();
        let run = ProbeRun {
            started: t0,
            finished: t0,
            streams: vec![],
        };
        let report = summarize(&run, ms(200));
        assert_eq!(report.requests, 0);
        assert_eq!(report.ttft_ms, Quantiles::default());
        assert_eq!(report.itl_ms, Quantiles::default());
        assert_eq!(report.stall_pct, None);
        assert_eq!(report.jank_ratio, None);
        assert_eq!(report.verdict, Verdict::Janky);
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["itl_ms"]["p50"].is_null());
        assert!(json["reading_bands"]["5_to_7"].is_null());
    }
}
