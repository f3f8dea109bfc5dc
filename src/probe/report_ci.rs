//! Reports CI systems render natively: JUnit XML (one test case per gate, and one for the run
//! itself, so GitLab and Jenkins show pass and fail per gate) and a Markdown summary (appended to
//! `$GITHUB_STEP_SUMMARY` on GitHub Actions).

use std::fmt::Write;
use std::time::Duration;

use super::gates::GateOutcome;
use super::stats::{Report, Verdict};
use crate::units::format_duration;

/// One run of the command (one rate of a sweep) and what was decided about it.
#[derive(Debug, Clone)]
pub struct Judged {
    /// `rate 2/s` in a sweep, `None` for a single run.
    pub label: Option<String>,
    /// The report.
    pub report: Report,
    /// The gates, checked.
    pub outcomes: Vec<GateOutcome>,
    /// Why the run itself failed (exit 3), `None` when it did not.
    pub run_failure: Option<String>,
}

/// The JUnit XML document: one `<testsuite>` per run, a `run` test case (an `<error>` when the
/// run itself failed) and one test case per gate (a `<failure>` when it failed).
pub fn render_junit(runs: &[Judged]) -> String {
    let cases: usize = runs.iter().map(|r| r.outcomes.len() + 1).sum();
    let failures: usize = runs
        .iter()
        .map(|r| r.outcomes.iter().filter(|o| !o.passed).count())
        .sum();
    let errors = runs.iter().filter(|r| r.run_failure.is_some()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"metronome probe\" tests=\"{cases}\" failures=\"{failures}\" errors=\"{errors}\">"
    );
    for run in runs {
        let name = match &run.label {
            Some(label) => format!("metronome probe ({label})"),
            None => "metronome probe".to_owned(),
        };
        let suite_failures = run.outcomes.iter().filter(|o| !o.passed).count();
        let seconds = run.report.detail.wall_time.as_secs_f64();
        let _ = write!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{suite_failures}\" errors=\"{}\" time=\"{seconds:.3}\"",
            xml(&name),
            run.outcomes.len() + 1,
            u8::from(run.run_failure.is_some()),
        );
        if let Some(meta) = &run.report.meta {
            let _ = write!(
                out,
                " timestamp=\"{}\"",
                xml(meta.started.trim_end_matches('Z'))
            );
        }
        out.push_str(">\n");
        let class = "metronome.probe";
        let _ = write!(
            out,
            "    <testcase classname=\"{class}\" name=\"run: {} streams, {} failed\" time=\"{seconds:.3}\"",
            run.report.requests, run.report.errors
        );
        match &run.run_failure {
            Some(why) => {
                let _ = writeln!(
                    out,
                    ">\n      <error type=\"run failed\" message=\"{}\"/>\n    </testcase>",
                    xml(why)
                );
            }
            None => out.push_str("/>\n"),
        }
        for outcome in &run.outcomes {
            let _ = write!(
                out,
                "    <testcase classname=\"{class}\" name=\"{}\" time=\"0\"",
                xml(&outcome.gate.text)
            );
            if outcome.passed {
                let _ = writeln!(
                    out,
                    "><system-out>{}</system-out></testcase>",
                    xml(&outcome.to_string())
                );
            } else {
                let _ = writeln!(
                    out,
                    ">\n      <failure type=\"gate\" message=\"{}\"/>\n    </testcase>",
                    xml(&outcome.to_string())
                );
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// The Markdown summary: a table with a row per run, then the gates, then (when given) the
/// comparison with the baseline.
pub fn render_markdown(describe: &str, runs: &[Judged], baseline: Option<&str>) -> String {
    let verdict = if runs.iter().all(|r| r.report.verdict == Verdict::Smooth) {
        "SMOOTH"
    } else {
        "JANKY"
    };
    let passed = runs
        .iter()
        .all(|r| r.run_failure.is_none() && r.outcomes.iter().all(|o| o.passed));
    let mut out = format!(
        "## metronome probe: {verdict}, {}\n\n{}\n\n",
        if passed { "passed" } else { "**failed**" },
        md(describe)
    );
    out.push_str(
        "| run | streams | failed | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | ITL max | tokens/s p50 | stalls | jank | goodput | req/s | output tok/s | verdict |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for run in runs {
        let r = &run.report;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            md(run.label.as_deref().unwrap_or("all")),
            r.requests,
            r.errors,
            ms(r.ttft_ms.p50),
            ms(r.ttft_ms.p99),
            ms(r.itl_ms.p50),
            ms(r.itl_ms.p99),
            ms(r.itl_ms.max),
            number(r.tokens_per_second.p50, 1),
            r.stall_pct.map_or("-".to_owned(), |v| format!("{v:.2}%")),
            number(r.jank_ratio, 2),
            r.goodput
                .as_ref()
                .and_then(|g| g.share)
                .map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0)),
            number(r.throughput.requests_per_second, 2),
            number(r.throughput.output_tokens_per_second, 1),
            match r.verdict {
                Verdict::Smooth => "SMOOTH",
                Verdict::Janky => "JANKY",
            }
        );
    }
    let failures: Vec<&str> = runs
        .iter()
        .filter_map(|r| r.run_failure.as_deref())
        .collect();
    if !failures.is_empty() {
        out.push_str("\n**The run failed:**\n\n");
        for why in failures {
            let _ = writeln!(out, "- {}", md(why));
        }
    }
    if runs.iter().any(|r| !r.outcomes.is_empty()) {
        out.push_str("\n| gate | run | result | measured |\n|---|---|---|---|\n");
        for run in runs {
            for o in &run.outcomes {
                let measured = o.to_string();
                let measured = measured.split_once(": ").map_or("", |(_, m)| m);
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} |",
                    o.gate.text.replace('`', "'"),
                    md(run.label.as_deref().unwrap_or("all")),
                    if o.passed { "✅ pass" } else { "❌ FAIL" },
                    md(measured)
                );
            }
        }
    }
    if let Some(table) = baseline {
        out.push_str("\n### Against the baseline\n\n");
        out.push_str(table);
    }
    out
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

/// Text in a Markdown table cell: pipes escaped, on one line.
fn md(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Text in an XML attribute or element.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_gates() {
        assert_eq!(
            xml("itl_p99<250ms & \"x\""),
            "itl_p99&lt;250ms &amp; &quot;x&quot;"
        );
        assert_eq!(xml("a\u{1}b"), "a b");
    }
}
