//! The HTML report's sections beyond the gaps: the result (the gates, the cause of a failure and
//! the verdict's reasons), the run's metadata, the TTFT distribution, a
//! percentile plot of TTFT and ITL on log scales (the tail a histogram hides: p99.9 sits a
//! decade to the right of p99, not in a one-pixel bar), and the stream list with each stream's
//! ID, linked to metronome's `/streams/{id}` when the run was joined (`--join`).

use std::fmt::Write;
use std::time::Duration;

use super::client::ProbeRun;
use super::judged::{summary, Judged, RunFailure};
use super::stats::{nearest_rank_per_mille, Report};
use super::verdict::RULE;
use crate::units::format_duration;

/// The percentile plot's points, in thousandths (p50 ... p99.99 ... max).
const PER_MILLE: [u32; 8] = [500, 750, 900, 950, 990, 995, 999, 1000];

/// At most this many streams are listed.
pub const MAX_LISTED: usize = 200;

const W: f64 = 900.0;
const H: f64 = 240.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 30.0;

/// The result: why the headline is what it is, the run's failure and its causes, each gate's
/// expression, value and result, and the verdict's reasons.
pub fn result_section(out: &mut String, judged: &Judged) {
    out.push_str("<h2>Result</h2>\n");
    match &judged.run_failure {
        None => {
            let one = std::slice::from_ref(judged);
            let _ = writeln!(out, "<p class=\"result\">{}</p>", escape(&summary(one)));
        }
        Some(failure) => failure_paragraphs(out, failure),
    }
    if !judged.outcomes.is_empty() {
        out.push_str(
            "<table class=\"gates\">\n<tr><th>gate</th><th>value</th><th>result</th></tr>\n",
        );
        for outcome in &judged.outcomes {
            let _ = writeln!(
                out,
                "<tr class=\"{}\"><td><code>{}</code></td><td>{}</td><td class=\"r\">{}</td></tr>",
                outcome.result.key(),
                escape(&outcome.gate.text),
                escape(&outcome.detail()),
                outcome.result.word()
            );
        }
        out.push_str("</table>\n");
    }
    let report = &judged.report;
    let _ = writeln!(
        out,
        "<p class=\"note\">Verdict {}: {}. {}.</p>",
        report.verdict.word(),
        escape(&report.evidence().explain()),
        escape(RULE)
    );
}

/// Why the run failed, and what the server or the client said.
fn failure_paragraphs(out: &mut String, failure: &RunFailure) {
    let _ = writeln!(
        out,
        "<p class=\"failure\"><strong>The run failed ({}):</strong> {}</p>",
        failure.kind.key(),
        escape(&failure.message)
    );
    if !failure.causes.is_empty() {
        out.push_str("<ul class=\"causes\">\n");
        for cause in &failure.causes {
            let _ = writeln!(out, "<li><code>{}</code></li>", escape(cause));
        }
        out.push_str("</ul>\n");
    }
}

/// The metadata table (`meta` of the JSON).
pub fn meta_section(out: &mut String, report: &Report) {
    let Some(m) = &report.meta else { return };
    out.push_str("<h2>Run</h2>\n<table class=\"meta\">\n");
    let load = match (m.load, m.concurrency, m.rate) {
        ("open", cap, Some(rate)) => match cap {
            Some(cap) => format!("open loop, {rate}/s, at most {cap} in flight"),
            None => format!("open loop, {rate}/s"),
        },
        (_, Some(c), _) => format!("closed loop, concurrency {c}"),
        (load, _, _) => load.to_owned(),
    };
    let rows = [
        ("metronome", m.version.to_owned()),
        ("URL", m.url.clone()),
        (
            "model",
            m.model.clone().unwrap_or_else(|| "(from --body)".into()),
        ),
        ("load", load),
        ("started", m.started.clone()),
        ("duration", format!("{:.2}s", m.duration_s)),
        ("command", m.command_line.join(" ")),
    ];
    for (name, value) in rows {
        let _ = writeln!(out, "<tr><th>{name}</th><td>{}</td></tr>", escape(&value));
    }
    out.push_str("</table>\n");
}

/// TTFT of every stream as a histogram on a linear axis from 0 to the slowest, 40 bins.
pub fn ttft_section(out: &mut String, run: &ProbeRun) {
    let ttfts: Vec<f64> = run
        .streams
        .iter()
        .filter_map(|s| s.ttft())
        .map(|d| d.as_secs_f64())
        .collect();
    out.push_str("<h2>Time to first token</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">TTFT of each of the {} streams with a token event, from the intended start.</p>",
        ttfts.len()
    );
    let max = ttfts.iter().copied().fold(0.0, f64::max);
    const BINS: usize = 40;
    let mut counts = [0u64; BINS];
    for &t in &ttfts {
        let bin = if max > 0.0 {
            ((t / max) * BINS as f64) as usize
        } else {
            0
        };
        counts[bin.min(BINS - 1)] += 1;
    }
    let tallest = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - 10.0;
    let _ = writeln!(
        out,
        "<svg class=\"ttft\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\"><title>TTFT histogram</title>"
    );
    let bw = plot_w / BINS as f64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let h = c as f64 / tallest * plot_h;
        let _ = writeln!(
            out,
            "<rect class=\"bar\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"><title>{c} streams</title></rect>",
            LEFT + i as f64 * bw,
            10.0 + plot_h - h,
            (bw - 1.0).max(1.0)
        );
    }
    axis_lines(out);
    for k in 0..=4 {
        let x = LEFT + plot_w * f64::from(k) / 4.0;
        let label = format_duration(Duration::from_secs_f64(max * f64::from(k) / 4.0));
        let _ = writeln!(
            out,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            H - 10.0
        );
    }
    let _ = writeln!(out, "<text x=\"4\" y=\"16\">{} max</text>", tallest as u64);
    out.push_str("</svg>\n");
}

/// TTFT and ITL at p50 ... p99.9 and max: x is the percentile on a log scale of 1/(1 - p), y the
/// latency on a log scale, so each decade of tail gets the same room.
pub fn percentile_section(out: &mut String, run: &ProbeRun) {
    out.push_str("<h2>Tail: latency by percentile</h2>\n");
    out.push_str(
        "<p class=\"note\">Both axes are logarithmic: the x axis spaces p50, p90, p99 and p99.9 \
         evenly (1 / (1 - p)), the y axis is the latency. A flat line is an even cadence; a line \
         that climbs at the right is a tail. Blue: gaps between token events (ITL, 0 shown at 1 µs); \
         orange: TTFT.</p>\n",
    );
    let series = percentile_series(run);
    let all = series.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v));
    let (lo, hi) = all.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo_dec, hi_dec) = if hi > 0.0 {
        let lo_dec = lo.log10().floor();
        (lo_dec, hi.log10().ceil().max(lo_dec + 1.0))
    } else {
        (-3.0, 0.0)
    };
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - 10.0;
    // x: log10(1 / (1 - p)) from p50 (0.301) to p99.99 (4); max drawn at p99.99.
    let x_of = |pm: u32| {
        let p = (f64::from(pm) / 1000.0).min(0.9999);
        let (a, b) = (2f64.log10(), 4.0);
        LEFT + ((1.0 / (1.0 - p)).log10() - a) / (b - a) * plot_w
    };
    let y_of = |v: f64| 10.0 + plot_h - (v.log10() - lo_dec) / (hi_dec - lo_dec) * plot_h;
    let _ = writeln!(
        out,
        "<svg class=\"percentiles\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\"><title>latency by percentile</title>"
    );
    let mut decade = lo_dec;
    while decade <= hi_dec {
        let y = y_of(10f64.powf(decade));
        let label = format_duration(Duration::from_secs_f64(10f64.powf(decade)));
        let _ = writeln!(
            out,
            "<line class=\"lane\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/><text x=\"4\" y=\"{:.1}\">{label}</text>",
            W - 10.0,
            y + 4.0
        );
        decade += 1.0;
    }
    draw_series(out, &series, &x_of, &y_of);
    axis_lines(out);
    out.push_str("</svg>\n");
}

/// The ITL and TTFT series: each `PER_MILLE` percentile with data, as (per mille, seconds), a
/// latency of 0 shown at 1 µs (the log axis has no 0).
fn percentile_series(run: &ProbeRun) -> Vec<(&'static str, Vec<(u32, f64)>)> {
    let mut ttft: Vec<Duration> = run.streams.iter().filter_map(|s| s.ttft()).collect();
    let mut itl: Vec<Duration> = run.streams.iter().flat_map(|s| s.gaps()).collect();
    ttft.sort_unstable();
    itl.sort_unstable();
    [("itl", &itl), ("ttft", &ttft)]
        .into_iter()
        .map(|(name, sorted)| {
            let points = PER_MILLE
                .iter()
                .filter_map(|&pm| {
                    nearest_rank_per_mille(sorted, pm).map(|d| (pm, d.as_secs_f64().max(1e-6)))
                })
                .collect();
            (name, points)
        })
        .collect()
}

/// The percentile labels under the plot, then each series as a line with a titled dot per
/// percentile, placed by `x_of` (per mille) and `y_of` (seconds).
fn draw_series(
    out: &mut String,
    series: &[(&str, Vec<(u32, f64)>)],
    x_of: &impl Fn(u32) -> f64,
    y_of: &impl Fn(f64) -> f64,
) {
    for (pm, name) in [
        (500, "p50"),
        (900, "p90"),
        (990, "p99"),
        (999, "p99.9"),
        (1000, "max"),
    ] {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{name}</text>",
            x_of(pm),
            H - 10.0
        );
    }
    for (name, points) in series {
        let class = if *name == "itl" {
            "line-itl"
        } else {
            "line-ttft"
        };
        let path: Vec<String> = points
            .iter()
            .map(|(pm, v)| format!("{:.1},{:.1}", x_of(*pm), y_of(*v)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                out,
                "<polyline class=\"{class}\" points=\"{}\"/>",
                path.join(" ")
            );
        }
        for (pm, v) in points {
            let _ = writeln!(
                out,
                "<circle class=\"{class}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\"><title>{name} p{} {}</title></circle>",
                x_of(*pm),
                y_of(*v),
                f64::from(*pm) / 10.0,
                format_duration(Duration::from_secs_f64(*v))
            );
        }
    }
}

/// The streams: index, status, TTFT, token events, the longest gap and the stream ID (a link to
/// `{admin}/streams/{id}` when the run was joined).
pub fn streams_section(out: &mut String, run: &ProbeRun, admin: Option<&str>) {
    out.push_str("<h2>Streams</h2>\n");
    let note = match admin {
        Some(admin) => format!(
            "Each ID links to the stream's ingress and egress timeline at {}/streams/{{id}} (kept while metronome retains it).",
            escape(admin.trim_end_matches('/'))
        ),
        None => "IDs are the proxy's x-metronome-stream-id; run with --join ADMIN_URL to link them to their timelines.".to_owned(),
    };
    let _ = writeln!(out, "<p class=\"note\">{note}</p>");
    out.push_str("<table class=\"streams\">\n<tr><th>#</th><th>result</th><th>TTFT</th><th>token events</th><th>longest gap</th><th>stream ID</th></tr>\n");
    for s in run.streams.iter().take(MAX_LISTED) {
        let result = match &s.error {
            Some(e) => e.kind().to_owned(),
            None => "ok".to_owned(),
        };
        let longest = s.gaps().max();
        let id = match (&s.stream_id, admin) {
            (Some(id), Some(admin)) => format!(
                "<a href=\"{}/streams/{}\">{}</a>",
                escape(admin.trim_end_matches('/')),
                escape(&percent_encode(id)),
                escape(id)
            ),
            (Some(id), None) => escape(id),
            (None, _) => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td>{result}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{id}</td></tr>",
            s.index,
            s.ttft().map_or("–".to_owned(), format_duration),
            s.token_times.len(),
            longest.map_or("–".to_owned(), format_duration),
        );
    }
    out.push_str("</table>\n");
    if run.streams.len() > MAX_LISTED {
        let _ = writeln!(
            out,
            "<p class=\"note\">Only the first {MAX_LISTED} of {} streams are listed.</p>",
            run.streams.len()
        );
    }
}

fn axis_lines(out: &mut String) {
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"10\" y2=\"{:.1}\"/><line class=\"axis\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
        H - BOTTOM,
        W - 10.0,
        H - BOTTOM,
        H - BOTTOM
    );
}

/// A stream ID as a path segment (IDs are plain tokens, but a server may send anything).
fn percent_encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use crate::probe::stream::StreamRecord;

    #[test]
    fn stream_ids_link_to_their_timelines_when_joined() {
        let t0 = Instant::now();
        let mut s = StreamRecord::new(0, t0);
        s.stream_id = Some("abc/1".into());
        s.token_times = vec![
            t0 + Duration::from_millis(30),
            t0 + Duration::from_millis(50),
        ];
        let run = ProbeRun {
            started: t0,
            finished: t0 + Duration::from_millis(60),
            streams: vec![s],
        };
        let mut joined = String::new();
        streams_section(&mut joined, &run, Some("http://127.0.0.1:9464/"));
        assert!(
            joined.contains("<a href=\"http://127.0.0.1:9464/streams/abc%2F1\">abc/1</a>"),
            "{joined}"
        );
        let mut plain = String::new();
        streams_section(&mut plain, &run, None);
        assert!(
            !plain.contains("<a ") && plain.contains("<td>abc/1</td>"),
            "{plain}"
        );
        let mut tail = String::new();
        percentile_section(&mut tail, &run);
        assert_eq!(tail.matches("<polyline").count(), 2, "{tail}");
        let mut ttft = String::new();
        ttft_section(&mut ttft, &run);
        assert_eq!(ttft.matches("<rect class=\"bar\"").count(), 1, "{ttft}");
    }
}
