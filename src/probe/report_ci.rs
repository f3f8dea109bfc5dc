//! Reports CI systems render natively: JUnit XML (one test case per gate, and one for the run
//! itself, so GitLab and Jenkins show pass and fail per gate) and a Markdown summary (appended to
//! `$GITHUB_STEP_SUMMARY` on GitHub Actions). Both lead with the headline the exit code is taken
//! from ([`Status`]), and a failed run's `<error>` carries its cause: the server's status and the
//! start of its body.

use std::fmt::Write;
use std::time::Duration;

use super::gates::{GateOutcome, GateResult};
use super::judged::{summary, Judged, RunFailure, Status};
use crate::units::format_duration;

/// The JUnit XML document: one `<testsuite>` per run with its headline, verdict and exit code as
/// properties, a `run` test case (an `<error>` when the run itself failed) and one test case per
/// gate (a `<failure>` when it failed, `<skipped>` when the run never took place).
pub fn render_junit(runs: &[Judged]) -> String {
    let cases: usize = runs.iter().map(|r| r.outcomes.len() + 1).sum();
    let (mut failures, mut skipped) = (0, 0);
    for run in runs {
        let (_, failed, not_measured) = run.gate_counts();
        failures += failed;
        skipped += not_measured;
    }
    let errors = runs.iter().filter(|r| r.run_failure.is_some()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"metronome probe\" tests=\"{cases}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">"
    );
    for run in runs {
        testsuite(&mut out, run);
    }
    out.push_str("</testsuites>\n");
    out
}

/// One run's `<testsuite>`.
fn testsuite(out: &mut String, run: &Judged) {
    let name = match &run.label {
        Some(label) => format!("metronome probe ({label})"),
        None => "metronome probe".to_owned(),
    };
    let (_, failed, not_measured) = run.gate_counts();
    let seconds = run.report.detail.wall_time.as_secs_f64();
    let _ = write!(
        out,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" errors=\"{}\" skipped=\"{not_measured}\" time=\"{seconds:.3}\"",
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
    out.push_str(">\n    <properties>\n");
    let one = std::slice::from_ref(run);
    let status = Status::of(one);
    let properties = [
        ("headline", status.headline().to_owned()),
        ("verdict", run.report.verdict.word().to_owned()),
        ("exit_code", status.exit_code().to_string()),
        ("summary", summary(one)),
        ("ttft_p50_ms", ms_value(run.report.ttft_ms.p50)),
        ("ttfo_p50_ms", ms_value(run.report.ttfo_ms.p50)),
        ("ttfo_p99_ms", ms_value(run.report.ttfo_ms.p99)),
        (
            "itl_content_p99_ms",
            ms_value(
                run.report
                    .phases
                    .as_ref()
                    .and_then(|p| p.get("content"))
                    .and_then(|f| f.itl_ms.p99),
            ),
        ),
    ];
    for (name, value) in properties {
        let _ = writeln!(
            out,
            "      <property name=\"{name}\" value=\"{}\"/>",
            xml(&value)
        );
    }
    out.push_str("    </properties>\n");
    let class = "metronome.probe";
    let _ = write!(
        out,
        "    <testcase classname=\"{class}\" name=\"run: {} streams, {} failed\" time=\"{seconds:.3}\"",
        run.report.requests, run.report.errors
    );
    match &run.run_failure {
        Some(failure) => {
            let _ = writeln!(
                out,
                ">\n      <error type=\"{}\" message=\"{}\">{}</error>\n    </testcase>",
                failure.kind.key(),
                xml(&failure.one_line()),
                xml(&failure_text(failure))
            );
        }
        None => out.push_str("/>\n"),
    }
    for outcome in &run.outcomes {
        gate_case(out, class, outcome);
    }
    out.push_str("  </testsuite>\n");
}

/// A gate's `<testcase>`: its expression is the name; value and result in its body.
fn gate_case(out: &mut String, class: &str, outcome: &GateOutcome) {
    let _ = write!(
        out,
        "    <testcase classname=\"{class}\" name=\"{}\" time=\"0\"",
        xml(&outcome.gate.text)
    );
    let line = xml(&outcome.to_string());
    let _ = match outcome.result {
        GateResult::Pass => writeln!(out, "><system-out>{line}</system-out></testcase>"),
        GateResult::Fail => writeln!(
            out,
            ">\n      <failure type=\"gate\" message=\"{line}\">{line}</failure>\n    </testcase>"
        ),
        GateResult::NotMeasured => writeln!(
            out,
            ">\n      <skipped message=\"{line}\"/>\n    </testcase>"
        ),
    };
}

/// A failure as the text of JUnit's `<error>`: the message, then each cause on a line.
fn failure_text(failure: &RunFailure) -> String {
    let mut text = failure.message.clone();
    for cause in &failure.causes {
        text.push('\n');
        text.push_str(cause);
    }
    text
}

/// The Markdown summary: the headline and why, a table with a row per run, then the gates, then
/// (when given) the comparison with the baseline.
pub fn render_markdown(describe: &str, runs: &[Judged], baseline: Option<&str>) -> String {
    let status = Status::of(runs);
    let passed = matches!(status, Status::Passed(_));
    let mut out = format!(
        "## metronome probe: {}\n\n{}: {}\n\n{}\n\n",
        status.headline(),
        if passed { "passed" } else { "**failed**" },
        md(&summary(runs)),
        md(describe)
    );
    out.push_str(
        "| run | streams | failed | TTFT p50 | TTFT p99 | TTFO p50 | TTFO p99 | ITL p50 | ITL p99 | ITL max | content ITL p99 | tokens/s p50 | stalls | stalled streams | jank | goodput | req/s | output tok/s | verdict |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for run in runs {
        let r = &run.report;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            md(run.label.as_deref().unwrap_or("all")),
            r.requests,
            r.errors,
            ms(r.ttft_ms.p50),
            ms(r.ttft_ms.p99),
            ms(r.ttfo_ms.p50),
            ms(r.ttfo_ms.p99),
            ms(r.itl_ms.p50),
            ms(r.itl_ms.p99),
            ms(r.itl_ms.max),
            ms(r
                .phases
                .as_ref()
                .and_then(|p| p.get("content"))
                .and_then(|f| f.itl_ms.p99)),
            number(r.tokens_per_second.p50, 1),
            percent(r.stall_pct),
            percent(r.stalled_streams_pct),
            number(r.jank_ratio, 2),
            r.goodput
                .as_ref()
                .and_then(|g| g.share)
                .map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0)),
            number(r.throughput.requests_per_second, 2),
            number(r.throughput.output_tokens_per_second, 1),
            r.verdict.word()
        );
    }
    let failures: Vec<&RunFailure> = runs.iter().filter_map(|r| r.run_failure.as_ref()).collect();
    if !failures.is_empty() {
        out.push_str("\n**The run failed:**\n\n");
        for failure in failures {
            let _ = writeln!(out, "- {}", md(&failure.message));
            for cause in &failure.causes {
                let _ = writeln!(out, "  - {}", md(cause));
            }
        }
    }
    if runs.iter().any(|r| !r.outcomes.is_empty()) {
        out.push_str("\n| gate | run | result | value |\n|---|---|---|---|\n");
        for run in runs {
            for o in &run.outcomes {
                let result = match o.result {
                    GateResult::Pass => "✅ pass",
                    GateResult::Fail => "❌ FAIL",
                    GateResult::NotMeasured => "⚪ not measured",
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {result} | {} |",
                    o.gate.text.replace('`', "'"),
                    md(run.label.as_deref().unwrap_or("all")),
                    md(&o.detail())
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

fn percent(value: Option<f64>) -> String {
    value.map_or("-".to_owned(), |v| format!("{v:.2}%"))
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

/// A latency in milliseconds as a property value (`-` without data).
fn ms_value(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
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
