//! The report as a terminal reads it: one line per figure, `-` where there is no data.

use std::fmt::Write;
use std::time::Duration;

use super::stats::{Quantiles, Report, Verdict};
use crate::units::format_duration;

/// Renders the report as aligned text lines, ending with the verdict.
pub fn render_text(report: &Report) -> String {
    let d = &report.detail;
    let mut out = String::new();
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
    let _ = writeln!(out, "TTFT           {}", quantiles(&report.ttft_ms));
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
        "stalls         {}   ({} of {} gaps over {})",
        percent(report.stall_pct),
        d.stalls,
        d.gaps,
        format_duration(d.stall_threshold)
    );
    let _ = writeln!(
        out,
        "jank ratio     {}   per stream p50 {}  p95 {}   ({} streams with 8+ gaps)",
        number(report.jank_ratio, 2),
        number(report.stream_jank_ratio.p50, 2),
        number(report.stream_jank_ratio.p95, 2),
        d.streams_with_jank
    );
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
    let why = match report.verdict {
        Verdict::Smooth => "jank ratio under 4 and median stream over 7 tokens/s",
        Verdict::Janky => "needs jank ratio under 4 and median stream over 7 tokens/s",
    };
    let word = match report.verdict {
        Verdict::Smooth => "SMOOTH",
        Verdict::Janky => "JANKY",
    };
    let _ = writeln!(out, "verdict        {word}   ({why})");
    out
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
    fn empty_run_shows_dashes_and_janky() {
        let t0 = Instant::now();
        let run = ProbeRun {
            started: t0,
            finished: t0,
            streams: vec![],
        };
        let text = render_text(&summarize(&run, Duration::from_millis(200)));
        assert!(text.contains("TTFT           p50 -  p95 -  p99 -  max -"));
        assert!(text.contains("stalls         -   (0 of 0 gaps over 200.0ms)"));
        assert!(text.ends_with(
            "verdict        JANKY   (needs jank ratio under 4 and median stream over 7 tokens/s)\n"
        ));
    }
}
