//! The report as a terminal reads it: one line per figure, `-` where there is no data, and at
//! the end the gates and the result line, whose headline is the exit code's (`judged.rs`).

use std::fmt::Write;
use std::time::Duration;

use super::attribution::Attribution;
use super::judged::{summary, Judged, Status};
use super::stats::{Quantiles, Report};
use crate::units::format_duration;

/// Renders the report as aligned text lines, ending with the verdict.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    streams_and_tokens(&mut out, report);
    cadence(&mut out, report);
    delivery(&mut out, report);
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "verdict        {}   ({})",
        report.verdict.word(),
        report.evidence().explain()
    );
    if let Some(attribution) = &report.attribution {
        out.push_str(&render_attribution(attribution));
    }
    out
}

/// The report's first lines: how many streams ran and failed (by kind, with an example of each),
/// and the tokens they carried.
fn streams_and_tokens(out: &mut String, report: &Report) {
    let d = &report.detail;
    let errors = if d.errors_by_kind.is_empty() {
        String::new()
    } else {
        let kinds: Vec<String> = d
            .errors_by_kind
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        format!(" ({})", kinds.join(", "))
    };
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "streams        {} in {}, {} failed{errors}",
        report.requests,
        format_duration(d.wall_time),
        report.errors
    );
    for (kind, example) in &d.error_examples {
        let _ = writeln!(out, "  {kind}: {example}");
    }
    let _ = writeln!(
        out,
        "tokens         {} output tokens in {} token events",
        d.output_tokens, d.token_events
    );
}

/// The cadence lines: TTFT, TTFO, ITL, tokens/s, stalls, jank, and the figures of each phase.
fn cadence(out: &mut String, report: &Report) {
    let d = &report.detail;
    let _ = writeln!(out, "TTFT           {}", quantiles(&report.ttft_ms));
    let _ = writeln!(
        out,
        "TTFO           {}   (to the first token event that is not reasoning)",
        quantiles(&report.ttfo_ms)
    );
    let _ = writeln!(
        out,
        "ITL            {}   ({} gaps, {} inside one frame)",
        quantiles(&report.itl_ms),
        d.gaps,
        d.clumped_gaps
    );
    let _ = writeln!(
        out,
        "tokens/s       p50 {}  p5 {}   (per stream: (tokens - 1) / (last - first token event), {} streams)",
        number(report.tokens_per_second.p50, 1),
        number(report.tokens_per_second.p5, 1),
        d.streams_with_tps
    );
    let _ = writeln!(
        out,
        "stalls         {}   ({} of {} gaps over {}; {} of {} streams stalled)",
        percent(report.stall_pct),
        d.stalls,
        d.gaps,
        format_duration(d.stall_threshold),
        d.stalled_streams,
        d.streams_with_gaps
    );
    let _ = writeln!(
        out,
        "jank ratio     {}   per stream p50 {}  p95 {}   ({} streams with 8+ gaps)",
        number(report.jank_ratio, 2),
        number(report.stream_jank_ratio.p50, 2),
        number(report.stream_jank_ratio.p95, 2),
        d.streams_with_jank
    );
    for (phase, f) in report.phases.iter().flatten() {
        let _ = writeln!(
            out,
            "  {phase:<12} {} token events; first p50 {}  p99 {}; ITL p50 {}  p99 {}; {} stalls",
            f.token_events,
            ms(f.first_ms.p50),
            ms(f.first_ms.p99),
            ms(f.itl_ms.p50),
            ms(f.itl_ms.p99),
            f.stalls
        );
    }
}

/// What the run delivered: the streams' reading speeds, the throughput and, with `--slo`, the
/// goodput.
fn delivery(out: &mut String, report: &Report) {
    let b = &report.reading_bands;
    let _ = writeln!(
        out,
        "reading speed  <5 {}  5-7 {}  7-15 {}  15-50 {}  50+ {}   (share of streams by tokens/s)",
        share(b.below_5),
        share(b.from_5_to_7),
        share(b.from_7_to_15),
        share(b.from_15_to_50),
        share(b.above_50)
    );
    let t = &report.throughput;
    let _ = writeln!(
        out,
        "throughput     {} completed streams/s, {} output tokens/s   (over the wall time)",
        number(t.requests_per_second, 2),
        number(t.output_tokens_per_second, 1)
    );
    if let Some(g) = &report.goodput {
        let met: Vec<String> = g
            .objectives
            .iter()
            .map(|o| format!("{} {}", o.objective, o.met))
            .collect();
        let _ = writeln!(
            out,
            "goodput        {}   ({} of {} streams met {}; {} good streams/s; met per objective: {})",
            share(g.share),
            g.good,
            g.streams,
            g.slo,
            number(g.per_second, 2),
            met.join(", ")
        );
    }
}

/// The `--rate-sweep` table: one row per rate, so the load where the cadence breaks shows.
pub fn render_sweep(runs: &[Judged]) -> String {
    let mut out = String::from(
        "sweep          rate        streams failed  TTFT p50  TTFT p99   ITL p50   ITL p99  stalls   jank goodput  verdict
",
    );
    for run in runs {
        let r = &run.report;
        let rate = r
            .meta
            .as_ref()
            .and_then(|m| m.rate)
            .map_or_else(|| "-".to_owned(), |v| format!("{v}/s"));
        let goodput = r.goodput.as_ref().and_then(|g| g.share);
        let _ = writeln!(
            out,
            "               {rate:<10} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>7}  {}",
            r.requests,
            r.errors,
            ms(r.ttft_ms.p50),
            ms(r.ttft_ms.p99),
            ms(r.itl_ms.p50),
            ms(r.itl_ms.p99),
            percent(r.stall_pct),
            number(r.jank_ratio, 2),
            share(goodput),
            r.verdict.word()
        );
    }
    out
}

/// The end of the report: each gate's line (prefixed with its rate in a sweep), then the result
/// line, whose headline is never the verdict when a gate or the run failed.
pub fn render_result(runs: &[Judged]) -> String {
    let mut out = String::new();
    for run in runs {
        let prefix = run
            .label
            .as_ref()
            .map(|l| format!("[{l}] "))
            .unwrap_or_default();
        for outcome in &run.outcomes {
            let _ = writeln!(out, "{prefix}{outcome}");
        }
    }
    let _ = writeln!(
        out,
        "result         {}   ({})",
        Status::of(runs).headline(),
        summary(runs)
    );
    out
}

/// The `--join` section: each percentile gap split into its parts, clumping, and the streams that
/// could not be joined.
pub fn render_attribution(a: &Attribution) -> String {
    let mut out = String::new();
    let n = &a.streams_not_joined;
    let not_joined = n.no_stream_id + n.not_found + n.fetch_error + n.no_token_events;
    let _ = writeln!(
        out,
        "attribution    {} of {} streams joined with {} ({} gaps)",
        a.streams_joined,
        a.streams_joined + not_joined,
        a.admin_url,
        a.gaps
    );
    gap_parts(&mut out, a);
    ttft_parts(&mut out, a);
    delivery_path(&mut out, a);
    join_problems(&mut out, a);
    out
}

/// Each ITL percentile split into its parts, the stalls by the part that made them, and each
/// point's own gap percentiles.
fn gap_parts(out: &mut String, a: &Attribution) {
    for (name, split) in [
        ("p50", a.gap_ms.p50),
        ("p95", a.gap_ms.p95),
        ("p99", a.gap_ms.p99),
    ] {
        let Some(g) = split else { continue };
        let _ = writeln!(
            out,
            "  ITL {name}      {} at the client = {} generation {} metronome {} after metronome",
            ms(Some(g.client)),
            ms(Some(g.generation)),
            signed(g.metronome),
            signed(g.after_metronome)
        );
        if g.generation_batch != 0.0 {
            let _ = writeln!(
                out,
                "                 its generation was a batch-wide hitch (another request's prefill)"
            );
        }
    }
    let st = &a.stalls;
    if st.stalls > 0 {
        let _ = writeln!(
            out,
            "  stalls       {} over {}: {} generation (batch), {} generation (stream), {} held back by the client, {} metronome, {} after metronome",
            st.stalls,
            ms(Some(st.threshold_ms)),
            st.generation_batch,
            st.generation_stream,
            st.held_by_client,
            st.metronome,
            st.after_metronome
        );
    }
    let points = &a.gaps_at_points_ms;
    if points.client.p50.is_some() {
        let _ = writeln!(
            out,
            "  gaps alone   p50 / p99 / p99.9 at ingress {}, at egress {}, at the client {}",
            points.ingress.as_ms_text("-"),
            points.egress.as_ms_text("-"),
            points.client.as_ms_text("-")
        );
    }
}

/// Each TTFT percentile split into its parts, and the shares of the client's waiting metronome
/// and what follows it added.
fn ttft_parts(out: &mut String, a: &Attribution) {
    for (name, split) in [
        ("p50", a.ttft_ms.p50),
        ("p95", a.ttft_ms.p95),
        ("p99", a.ttft_ms.p99),
    ] {
        let Some(t) = split else { continue };
        let _ = writeln!(
            out,
            "  TTFT {name}     {} at the client = {} generation {} metronome {} held after metronome {} network",
            ms(Some(t.client)),
            ms(Some(t.generation)),
            signed(t.metronome),
            signed(t.after_metronome),
            signed(t.network)
        );
    }
    if let (Some(metronome), Some(after)) = (a.wait_share.metronome, a.wait_share.after_metronome) {
        let _ = writeln!(
            out,
            "  waiting      of {} between token events, {:.1}% added by metronome, {:.1}% after metronome",
            ms(Some(a.detail.client_wait_ms)),
            metronome * 100.0,
            after * 100.0
        );
    }
}

/// How the path delivers events: clumping at the client against the upstream's frames, and the
/// base delay of a round trip.
fn delivery_path(out: &mut String, a: &Attribution) {
    let c = &a.clumping;
    let _ = writeln!(
        out,
        "  clumping     {} events per client read (p95 {}) against {} per upstream frame (p95 {})",
        number(c.events_per_read.mean, 2),
        number(c.events_per_read.p95, 0),
        number(c.events_per_frame.mean, 2),
        number(c.events_per_frame.p95, 0)
    );
    let _ = writeln!(
        out,
        "  base delay   p50 {}  max {}   (per stream: the request's trip plus the least return trip)",
        ms(a.base_delay_ms.p50),
        ms(a.base_delay_ms.max)
    );
}

/// What the join could not line up: streams whose token events differ in number, and streams not
/// joined, by reason, with an example of each.
fn join_problems(out: &mut String, a: &Attribution) {
    let n = &a.streams_not_joined;
    let not_joined = n.no_stream_id + n.not_found + n.fetch_error + n.no_token_events;
    if a.token_count_mismatches > 0 {
        let _ = writeln!(
            out,
            "  mismatches   {} joined streams counted different token events at the client and in the timeline (matched up to the shorter)",
            a.token_count_mismatches
        );
    }
    if not_joined > 0 {
        let _ = writeln!(
            out,
            "  not joined   {not_joined}: no stream ID {}, not found {}, fetch error {}, no token event {}",
            n.no_stream_id, n.not_found, n.fetch_error, n.no_token_events
        );
        for (kind, example) in &a.detail.examples {
            let _ = writeln!(out, "    {kind}: {example}");
        }
    }
}

/// `+ 1.2ms` or `- 30.0ms`: a part of a sum whose sign matters.
fn signed(value_ms: f64) -> String {
    let sign = if value_ms < 0.0 { '-' } else { '+' };
    format!("{sign} {}", ms(Some(value_ms.abs())))
}

fn quantiles(q: &Quantiles) -> String {
    format!(
        "p50 {}  p95 {}  p99 {}  max {}",
        ms(q.p50),
        ms(q.p95),
        ms(q.p99),
        ms(q.max)
    )
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(
        || "-".to_owned(),
        |v| format_duration(Duration::from_secs_f64(v.max(0.0) / 1e3)),
    )
}

fn number(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}%"))
}

fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", v * 100.0))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::probe::client::ProbeRun;
    use crate::probe::stats::summarize;

    #[test]
    fn attribution_reads_as_sums() {
        use crate::probe::attribution::{GapSplit, Percentiles};
        let mut a = Attribution {
            admin_url: "http://127.0.0.1:9464".into(),
            streams_joined: 3,
            gaps: 57,
            ..Attribution::default()
        };
        a.streams_not_joined.not_found = 1;
        a.detail
            .examples
            .insert("not_found", "GET x: 404".to_owned());
        a.gap_ms = Percentiles {
            p50: Some(GapSplit {
                client: 0.0,
                generation: 30.0,
                generation_batch: 0.0,
                generation_stream: 0.0,
                metronome: 0.012,
                after_metronome: -30.012,
            }),
            ..Percentiles::default()
        };
        let text = render_attribution(&a);
        assert!(text.starts_with(
            "attribution    3 of 4 streams joined with http://127.0.0.1:9464 (57 gaps)\n"
        ));
        assert!(text.contains(
            "  ITL p50      0us at the client = 30.0ms generation + 12us metronome - 30.0ms after metronome\n"
        ), "{text}");
        assert!(text.contains("  not joined   1: no stream ID 0, not found 1"));
        assert!(text.contains("    not_found: GET x: 404\n"));
    }

    #[test]
    fn empty_run_shows_dashes_and_janky() {
        let t0 = Instant::now();
        let run = ProbeRun {
            started: t0,
            finished: t0,
            streams: vec![],
        };
        let text = render_text(&summarize(&run, Duration::from_millis(200)));
        assert!(text.contains("TTFT           p50 -  p95 -  p99 -  max -"));
        assert!(
            text.contains("stalls         -   (0 of 0 gaps over 200.0ms; 0 of 0 streams stalled)")
        );
        assert!(text.ends_with(
            "verdict        JANKY   (no stream had two token events; no stream had 8 gaps for a \
             jank ratio; no stream had a tokens/s)\n"
        ));
    }
}
