//! The report as one self-contained HTML page: the headline the exit code is taken from (FAIL on
//! a failed gate, ERROR on a failed run, the verdict otherwise), the gates and the cause of a
//! failure, the summary table and verdict, the gap histogram on
//! a log time axis with the stall threshold marked, and a cadence strip per stream (one tick per
//! token event) so stalls and clumps show at a glance. Inline SVG and CSS only: no scripts, no
//! external resources, so the file can be attached to a CI run and opened anywhere.
//!
//! The page is also well-formed XML (every element closed, attributes quoted), which lets a plain
//! XML parser check it.

use std::fmt::Write;
use std::time::{Duration, Instant};

use super::attribution::Attribution;
use super::client::ProbeRun;
use super::judged::{Judged, Status};
use super::report_html_more as more;
use super::stats::{millis, Quantiles, Report};
use super::stream::StreamRecord;
use crate::units::format_duration;

/// At most this many streams get a cadence strip (the first ones, in start order); the page says
/// when streams were left out.
pub const MAX_STRIPS: usize = 200;

/// Histogram bins per decade of the log time axis.
const BINS_PER_DECADE: u32 = 10;

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1000px}\
h1 .v{padding:.1em .5em;border-radius:.3em;color:#fff}h1 .verdict{font-size:60%;color:#555}\
.SMOOTH{background:#2a7d3f}.JANKY,.FAIL{background:#b3261e}.ERROR{background:#6b1510}\
tr.pass td.r{color:#2a7d3f}tr.fail td.r,tr.not_measured td.r{color:#b3261e;font-weight:bold}\
table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
p.note{color:#555;max-width:60em}\
svg text{font:11px system-ui,sans-serif;fill:#444}\
.bar{fill:#4a78b5}.bar.stall{fill:#b3261e}.bar.zero{fill:#e08a00}\
.axis{stroke:#888;stroke-width:1}.threshold{stroke:#b3261e;stroke-width:1.5;stroke-dasharray:4 3}\
.lane{stroke:#e6e6e6}.lane.failed{stroke:#f3c1bd}\
.line-itl{stroke:#4a78b5;fill:#4a78b5;stroke-width:2}polyline.line-itl,polyline.line-ttft{fill:none}\
.line-ttft{stroke:#e08a00;fill:#e08a00;stroke-width:2}\
.tick{stroke:#333;stroke-width:1}.clump{stroke:#e08a00;stroke-width:2}.gap{fill:#b3261e;opacity:.35}";

/// Renders the page of a run without gates. `title` names what was probed (the URL).
pub fn render_html(run: &ProbeRun, report: &Report, title: &str) -> String {
    let judged = Judged::measured(None, report.clone(), Vec::new(), 1.0, false);
    render_html_judged(run, &judged, title, None)
}

/// The page of a judged run (its gates, its failure), linking each stream ID to
/// `{admin}/streams/{id}` (the `--join` URL).
pub fn render_html_judged(
    run: &ProbeRun,
    judged: &Judged,
    title: &str,
    admin: Option<&str>,
) -> String {
    let report = &judged.report;
    let headline = Status::of(std::slice::from_ref(judged)).headline();
    let verdict = report.verdict.word();
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n\
         <title>metronome probe: {headline}</title>\n<style>{CSS}</style>\n</head>\n<body>\n\
         <h1>metronome probe <span class=\"v {headline}\">{headline}</span> \
         <span class=\"verdict\">verdict {verdict}</span></h1>\n\
         <p class=\"note\">{}</p>\n",
        escape(title)
    );
    more::result_section(&mut out, judged);
    summary_table(&mut out, report);
    more::meta_section(&mut out, report);
    if let Some(attribution) = &report.attribution {
        attribution_section(&mut out, attribution);
    }
    out.push_str("<h2>Gaps between token events</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">Every gap between consecutive token events, all streams pooled, on a \
         log time axis. The orange bar on the left counts gaps of 0 (token events that arrived in \
         one frame: clumps); red bars are stalls, gaps over the {} threshold (dashed line).</p>",
        format_duration(report.detail.stall_threshold)
    );
    histogram(&mut out, run, report.detail.stall_threshold);
    more::percentile_section(&mut out, run);
    more::ttft_section(&mut out, run);
    out.push_str("<h2>Cadence per stream</h2>\n");
    let shown = run.streams.len().min(MAX_STRIPS);
    let left_out = if run.streams.len() > shown {
        format!(
            " Only the first {shown} of {} streams are drawn.",
            run.streams.len()
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "<p class=\"note\">One row per stream, from its intended start; one tick per token event. \
         Red shading marks stalls, orange ticks token events that arrived in the same frame as \
         the one before, a red lane a stream that failed.{left_out}</p>"
    );
    strips(&mut out, run, report.detail.stall_threshold);
    more::streams_section(&mut out, run, admin);
    out.push_str("</body>\n</html>\n");
    out
}

fn summary_table(out: &mut String, r: &Report) {
    let q = |q: &Quantiles| {
        format!(
            "p50 {} · p95 {} · p99 {} · max {}",
            ms(q.p50),
            ms(q.p95),
            ms(q.p99),
            ms(q.max)
        )
    };
    let num = |v: Option<f64>, decimals: usize| {
        v.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
    };
    let pct = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{:.0}%", v * 100.0));
    let b = &r.reading_bands;
    let mut errors = r.errors.to_string();
    for (kind, n) in &r.detail.errors_by_kind {
        let _ = write!(errors, " · {kind} {n}");
    }
    let rows = [
        (
            "streams",
            format!("{} in {}", r.requests, format_duration(r.detail.wall_time)),
        ),
        ("errors", errors),
        ("TTFT", q(&r.ttft_ms)),
        ("TTFO (first output, not reasoning)", q(&r.ttfo_ms)),
        ("ITL (gap)", q(&r.itl_ms)),
        ("ITL by phase", phase_itl(r)),
        (
            "tokens/s per stream",
            format!(
                "p50 {} · p5 {}",
                num(r.tokens_per_second.p50, 1),
                num(r.tokens_per_second.p5, 1)
            ),
        ),
        (
            "stalls",
            format!(
                "{} ({} of {} gaps over {}; {} of {} streams stalled)",
                r.stall_pct
                    .map_or_else(|| "–".to_owned(), |v| format!("{v:.2}%")),
                r.detail.stalls,
                r.detail.gaps,
                format_duration(r.detail.stall_threshold),
                r.detail.stalled_streams,
                r.detail.streams_with_gaps
            ),
        ),
        ("jank ratio", num(r.jank_ratio, 2)),
        (
            "jank ratio per stream",
            format!(
                "p50 {} · p95 {}",
                num(r.stream_jank_ratio.p50, 2),
                num(r.stream_jank_ratio.p95, 2)
            ),
        ),
        (
            "reading speed (share of streams)",
            format!(
                "&lt;5 {} · 5–7 {} · 7–15 {} · 15–50 {} · 50+ {}",
                pct(b.below_5),
                pct(b.from_5_to_7),
                pct(b.from_7_to_15),
                pct(b.from_15_to_50),
                pct(b.above_50)
            ),
        ),
    ];
    out.push_str("<table>\n");
    for (name, value) in rows {
        let _ = writeln!(out, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    out.push_str("</table>\n");
    for (kind, example) in &r.detail.error_examples {
        let _ = writeln!(out, "<p class=\"note\">{kind}: {}</p>", escape(example));
    }
}

/// The `--join` section: each percentile split into generation, metronome and after metronome.
fn attribution_section(out: &mut String, a: &Attribution) {
    let n = &a.streams_not_joined;
    let not_joined = n.no_stream_id + n.not_found + n.fetch_error + n.no_token_events;
    let _ = writeln!(
        out,
        "<h2>Where the gaps come from</h2>\n<p class=\"note\">{} of {} streams joined with the \
         timelines of {} ({} gaps). Each row is the client's gap at that percentile (one pair of \
         token events), split into the ingress gap of the same pair (generation), the change in \
         metronome's delay, and the rest, after metronome: a buffering edge shows as a negative \
         part where it clumps events and a large positive one where it releases them.</p>",
        a.streams_joined,
        a.streams_joined + not_joined,
        escape(&a.admin_url),
        a.gaps
    );
    split_table(out, a);
    stalls_and_waiting(out, a);
    not_joined_notes(out, a);
}

/// The table of ITL and TTFT percentiles, each split into its parts, and a note when the ITL
/// p99's generation was a batch-wide hitch.
fn split_table(out: &mut String, a: &Attribution) {
    out.push_str(
        "<table>\n<tr><th></th><th>client</th><th>generation</th><th>metronome</th>\
         <th>after metronome</th><th>network</th></tr>\n",
    );
    let gaps = [
        ("ITL p50", a.gap_ms.p50),
        ("ITL p95", a.gap_ms.p95),
        ("ITL p99", a.gap_ms.p99),
    ];
    for (name, split) in gaps {
        let Some(g) = split else { continue };
        let _ = writeln!(
            out,
            "<tr><th>{name}</th><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td></td></tr>",
            signed_ms(g.client),
            signed_ms(g.generation),
            signed_ms(g.metronome),
            signed_ms(g.after_metronome)
        );
    }
    let ttfts = [
        ("TTFT p50", a.ttft_ms.p50),
        ("TTFT p95", a.ttft_ms.p95),
        ("TTFT p99", a.ttft_ms.p99),
    ];
    for (name, split) in ttfts {
        let Some(t) = split else { continue };
        let _ = writeln!(
            out,
            "<tr><th>{name}</th><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            signed_ms(t.client),
            signed_ms(t.generation),
            signed_ms(t.metronome),
            signed_ms(t.after_metronome),
            signed_ms(t.network)
        );
    }
    out.push_str("</table>\n");
    if let Some(g) = a.gap_ms.p99.filter(|g| g.generation_batch != 0.0) {
        let _ = writeln!(
            out,
            "<p class=\"note\">The ITL p99's generation ({}) was a batch-wide hitch: another \
             request's prefill held the engine's step for every stream (docs/batch.md).</p>",
            signed_ms(g.generation_batch)
        );
    }
}

/// The stalls by the part that made them, the shares of the client's waiting, clumping, base
/// delay, and each point's own gap percentiles.
fn stalls_and_waiting(out: &mut String, a: &Attribution) {
    let st = &a.stalls;
    if st.stalls > 0 {
        let _ = writeln!(
            out,
            "<p>Stalls at the client (gaps over {} ms): {}, of them mostly generation in a \
             batch-wide hitch {}, generation of the stream's own {}, held back by the client {}, \
             metronome {}, after metronome {}.</p>",
            st.threshold_ms,
            st.stalls,
            st.generation_batch,
            st.generation_stream,
            st.held_by_client,
            st.metronome,
            st.after_metronome
        );
    }
    let share = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let num = |v: Option<f64>, decimals: usize| {
        v.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
    };
    let c = &a.clumping;
    let _ = writeln!(
        out,
        "<p class=\"note\">Of the client's waiting between token events, {} was added by \
         metronome and {} after metronome. Clumping: {} events per client read (p95 {}) against \
         {} per upstream frame (p95 {}). Base delay p50 {}, max {}.</p>",
        share(a.wait_share.metronome),
        share(a.wait_share.after_metronome),
        num(c.events_per_read.mean, 2),
        num(c.events_per_read.p95, 0),
        num(c.events_per_frame.mean, 2),
        num(c.events_per_frame.p95, 0),
        ms(a.base_delay_ms.p50),
        ms(a.base_delay_ms.max)
    );
    let points = &a.gaps_at_points_ms;
    if points.client.p50.is_some() {
        let _ = writeln!(
            out,
            "<p class=\"note\">The gaps at each point alone (p50 / p99 / p99.9), where a tail is \
             born: at ingress {}, at egress {}, at the client {}.</p>",
            points.ingress.as_ms_text("–"),
            points.egress.as_ms_text("–"),
            points.client.as_ms_text("–")
        );
    }
}

/// The streams not joined, by reason, with an example of each.
fn not_joined_notes(out: &mut String, a: &Attribution) {
    let n = &a.streams_not_joined;
    let not_joined = n.no_stream_id + n.not_found + n.fetch_error + n.no_token_events;
    if not_joined > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">Not joined: {not_joined} (no stream ID {}, not found {}, fetch \
             error {}, no token event {}).</p>",
            n.no_stream_id, n.not_found, n.fetch_error, n.no_token_events
        );
        for (kind, example) in &a.detail.examples {
            let _ = writeln!(out, "<p class=\"note\">{kind}: {}</p>", escape(example));
        }
    }
}

/// A duration in milliseconds that may be negative (a part of a sum).
fn signed_ms(value: f64) -> String {
    let sign = if value < 0.0 { "−" } else { "" };
    format!("{sign}{}", ms(Some(value.abs())))
}

/// The pooled gap histogram, log-binned, with a separate bar for gaps of 0.
fn histogram(out: &mut String, run: &ProbeRun, threshold: Duration) {
    let t = threshold.as_secs_f64().max(1e-6);
    let bins = GapBins::of(run, t);
    let frame = HistogramFrame::new(&bins);
    let (width, height) = (frame.width, frame.height);
    let _ = writeln!(
        out,
        "<svg width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\" \
         aria-label=\"histogram of gaps between token events\">"
    );
    histogram_bars(out, &bins, &frame, t);
    histogram_axes(out, &bins, &frame, t, threshold);
    out.push_str("</svg>\n");
}

/// A run's gaps between token events, all streams pooled: gaps of 0 apart, the others counted
/// in `BINS_PER_DECADE` log bins per decade.
struct GapBins {
    /// Gaps of 0 (token events that arrived in one frame).
    zero: u64,
    /// The count of each bin, from `lo_decade` up.
    counts: Vec<u64>,
    /// The decades the bins span (powers of ten, seconds).
    lo_decade: i32,
    hi_decade: i32,
    /// The largest count (at least 1): the height of the tallest bar.
    tallest: f64,
}

impl GapBins {
    /// The bins of `run`'s gaps; `t` is the stall threshold in seconds.
    fn of(run: &ProbeRun, t: f64) -> Self {
        let mut zero = 0u64;
        let mut min = f64::INFINITY;
        let mut max = 0f64;
        let gaps: Vec<f64> = run
            .streams
            .iter()
            .flat_map(|s| s.gaps())
            .map(|g| g.as_secs_f64())
            .collect();
        for &g in &gaps {
            if g <= 0.0 {
                zero += 1;
            } else {
                min = min.min(g);
                max = max.max(g);
            }
        }
        // Decades from below the smallest gap (at most 1 ms) to above the largest (at least 2x
        // the threshold), so the threshold line is always on the axis.
        let lo_decade = min.min(1e-3).log10().floor() as i32;
        let hi_decade = (max.max(t * 2.0).log10().ceil() as i32).max(lo_decade + 1);
        let bins = ((hi_decade - lo_decade) as u32 * BINS_PER_DECADE) as usize;
        let mut counts = vec![0u64; bins];
        for &g in gaps.iter().filter(|g| **g > 0.0) {
            let pos = (g.log10() - f64::from(lo_decade)) * f64::from(BINS_PER_DECADE);
            let bin = (pos.floor().max(0.0) as usize).min(bins - 1);
            counts[bin] += 1;
        }
        let tallest = counts
            .iter()
            .copied()
            .chain([zero])
            .max()
            .unwrap_or(0)
            .max(1) as f64;
        GapBins {
            zero,
            counts,
            lo_decade,
            hi_decade,
            tallest,
        }
    }
}

/// Where the histogram's parts go on the page, in pixels: the bar for gaps of 0 on the left,
/// then the log-scaled plot.
struct HistogramFrame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    zero_w: f64,
    plot_x: f64,
    plot_w: f64,
    plot_h: f64,
    /// The x axis's height: the bars' foot.
    base: f64,
    lo_decade: i32,
    hi_decade: i32,
}

impl HistogramFrame {
    fn new(bins: &GapBins) -> Self {
        let (width, height) = (900.0, 260.0);
        let (left, right, top, bottom) = (70.0, 20.0, 15.0, 40.0);
        let zero_w = 24.0;
        let plot_x = left + zero_w + 36.0;
        let plot_w = width - plot_x - right;
        let plot_h = height - top - bottom;
        HistogramFrame {
            width,
            height,
            left,
            right,
            top,
            zero_w,
            plot_x,
            plot_w,
            plot_h,
            base: top + plot_h,
            lo_decade: bins.lo_decade,
            hi_decade: bins.hi_decade,
        }
    }

    /// The x of a gap of `seconds` on the log axis.
    fn x_of(&self, seconds: f64) -> f64 {
        self.plot_x
            + (seconds.log10() - f64::from(self.lo_decade))
                / f64::from(self.hi_decade - self.lo_decade)
                * self.plot_w
    }

    /// The height of a bar of `count` gaps (at least 2 pixels, so a single gap shows).
    fn bar_h(&self, count: u64, tallest: f64) -> f64 {
        if count == 0 {
            0.0
        } else {
            (count as f64 / tallest * self.plot_h).max(2.0)
        }
    }
}

/// The bars: gaps of 0 on the left, then one per bin with gaps, red from the threshold `t` on.
fn histogram_bars(out: &mut String, bins: &GapBins, frame: &HistogramFrame, t: f64) {
    let (left, zero_w, base, plot_x) = (frame.left, frame.zero_w, frame.base, frame.plot_x);
    let (zero, lo_decade) = (bins.zero, bins.lo_decade);
    // The bar for gaps of 0.
    let h = frame.bar_h(zero, bins.tallest);
    let _ = writeln!(
        out,
        "<rect class=\"bar zero\" x=\"{left:.1}\" y=\"{:.1}\" width=\"{zero_w:.1}\" height=\"{h:.1}\">\
         <title>gap 0 (same frame): {zero}</title></rect>",
        base - h
    );
    if zero > 0 {
        count_label(out, left + zero_w / 2.0, base - h, zero);
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">0</text>",
        left + zero_w / 2.0,
        base + 14.0
    );
    let bin_w = frame.plot_w / bins.counts.len() as f64;
    for (i, &count) in bins.counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let from = 10f64.powf(f64::from(lo_decade) + i as f64 / f64::from(BINS_PER_DECADE));
        let to = 10f64.powf(f64::from(lo_decade) + (i + 1) as f64 / f64::from(BINS_PER_DECADE));
        let class = if from >= t { "bar stall" } else { "bar" };
        let h = frame.bar_h(count, bins.tallest);
        let _ = writeln!(
            out,
            "<rect class=\"{class}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\">\
             <title>{} to {}: {count}</title></rect>",
            plot_x + i as f64 * bin_w + 0.5,
            base - h,
            (bin_w - 1.0).max(0.5),
            format_duration(Duration::from_secs_f64(from)),
            format_duration(Duration::from_secs_f64(to)),
        );
        count_label(out, plot_x + (i as f64 + 0.5) * bin_w, base - h, count);
    }
}

/// The axes, decade ticks and labels, and the dashed threshold line at `t` seconds.
fn histogram_axes(
    out: &mut String,
    bins: &GapBins,
    frame: &HistogramFrame,
    t: f64,
    threshold: Duration,
) {
    let (left, top, base) = (frame.left, frame.top, frame.base);
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{left:.1}\" y1=\"{base:.1}\" x2=\"{:.1}\" y2=\"{base:.1}\"/>",
        frame.width - frame.right
    );
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{left:.1}\" y1=\"{top:.1}\" x2=\"{left:.1}\" y2=\"{base:.1}\"/>"
    );
    for decade in bins.lo_decade..=bins.hi_decade {
        let x = frame.x_of(10f64.powi(decade));
        let label = round_label(10f64.powi(decade));
        let _ = writeln!(
            out,
            "<line class=\"axis\" x1=\"{x:.1}\" y1=\"{base:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            base + 4.0,
            base + 16.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">0</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">gap (log scale); bar height: number of gaps</text>",
        left - 6.0,
        top + 10.0,
        bins.tallest as u64,
        left - 6.0,
        base,
        frame.plot_x + frame.plot_w / 2.0,
        frame.height - 6.0
    );
    let x = frame.x_of(t);
    let _ = writeln!(
        out,
        "<line class=\"threshold\" x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{base:.1}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">stall {}</text>",
        x + 4.0,
        top + 10.0,
        format_duration(threshold)
    );
}

/// One lane per stream with a tick per token event, on a shared time axis.
fn strips(out: &mut String, run: &ProbeRun, threshold: Duration) {
    let streams = &run.streams[..run.streams.len().min(MAX_STRIPS)];
    let span = streams
        .iter()
        .map(|s| lane_end(s).saturating_duration_since(s.scheduled))
        .max()
        .unwrap_or_default()
        .as_secs_f64()
        .max(1e-3);
    let frame = StripFrame::new(span, streams.len());
    let (width, height) = (frame.width, frame.height);
    let _ = writeln!(
        out,
        "<svg width=\"{width}\" height=\"{height:.0}\" viewBox=\"0 0 {width} {height:.0}\" role=\"img\" \
         aria-label=\"token events per stream over time\">"
    );
    for (row, s) in streams.iter().enumerate() {
        strip_lane(out, &frame, row, s, threshold);
    }
    strip_axes(out, &frame, streams);
    out.push_str("</svg>\n");
}

/// Where a stream's lane ends: its last token event or its end, whichever is later.
fn lane_end(s: &StreamRecord) -> Instant {
    s.finished
        .into_iter()
        .chain(s.token_times.last().copied())
        .max()
        .unwrap_or(s.scheduled)
}

/// Where the strips' parts go on the page, in pixels, for `span` seconds of time.
struct StripFrame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    lane_h: f64,
    lane_gap: f64,
    plot_w: f64,
    span: f64,
}

impl StripFrame {
    fn new(span: f64, lanes: usize) -> Self {
        let (width, left, right, top) = (900.0, 70.0, 20.0, 10.0);
        let (lane_h, lane_gap) = (6.0, 3.0);
        StripFrame {
            width,
            height: top + lanes as f64 * (lane_h + lane_gap) + 44.0,
            left,
            right,
            top,
            lane_h,
            lane_gap,
            plot_w: width - left - right,
            span,
        }
    }

    /// The x of `at` on the lane of `s`, counted from the stream's intended start.
    fn x_of(&self, s: &StreamRecord, at: Instant) -> f64 {
        self.left
            + at.saturating_duration_since(s.scheduled).as_secs_f64() / self.span * self.plot_w
    }
}

/// The lane of the stream `s` in `row`: its bar (red when it failed, its figures as its title),
/// a tick per token event, orange for one in the frame of the one before, red shading for a stall.
fn strip_lane(
    out: &mut String,
    frame: &StripFrame,
    row: usize,
    s: &StreamRecord,
    threshold: Duration,
) {
    let (left, lane_h) = (frame.left, frame.lane_h);
    let y = frame.top + row as f64 * (lane_h + frame.lane_gap);
    let mid = y + lane_h / 2.0;
    let lane = if s.error.is_some() {
        "lane failed"
    } else {
        "lane"
    };
    let about = match &s.error {
        Some(e) => format!("failed: {e}"),
        None => format!(
            "{} tokens, TTFT {}, {:.1} tokens/s",
            s.output_tokens(),
            ms(s.ttft().map(millis)),
            s.tokens_per_second().unwrap_or(0.0)
        ),
    };
    let _ = write!(
        out,
        "<g><title>stream {}: {}</title>\
         <line class=\"{lane}\" x1=\"{left:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" y2=\"{mid:.1}\" stroke-width=\"{lane_h}\"/>",
        s.index,
        escape(&about),
        frame.x_of(s, lane_end(s)).max(left + 1.0)
    );
    let (mut ticks, mut clumps, mut stalls) = (String::new(), String::new(), String::new());
    let mut previous: Option<Instant> = None;
    for &at in &s.token_times {
        let x = frame.x_of(s, at);
        match previous {
            Some(p) if at == p => {
                let _ = write!(clumps, "M{x:.1} {y:.1}v{lane_h}");
            }
            Some(p) if at.saturating_duration_since(p) > threshold => {
                let x0 = frame.x_of(s, p);
                let _ = write!(stalls, "M{x0:.1} {y:.1}H{x:.1}v{lane_h}H{x0:.1}Z");
                let _ = write!(ticks, "M{x:.1} {y:.1}v{lane_h}");
            }
            _ => {
                let _ = write!(ticks, "M{x:.1} {y:.1}v{lane_h}");
            }
        }
        previous = Some(at);
    }
    for (class, d) in [("gap", &stalls), ("tick", &ticks), ("clump", &clumps)] {
        if !d.is_empty() {
            let _ = write!(out, "<path class=\"{class}\" d=\"{d}\"/>");
        }
    }
    out.push_str("</g>\n");
}

/// The time axis under the lanes, with round ticks, and the stream numbers down the left.
fn strip_axes(out: &mut String, frame: &StripFrame, streams: &[StreamRecord]) {
    let (left, top, lane_h, lane_gap) = (frame.left, frame.top, frame.lane_h, frame.lane_gap);
    let (span, plot_w) = (frame.span, frame.plot_w);
    let base = top + streams.len() as f64 * (lane_h + lane_gap) + 4.0;
    let _ = writeln!(
        out,
        "<line class=\"axis\" x1=\"{left:.1}\" y1=\"{base:.1}\" x2=\"{:.1}\" y2=\"{base:.1}\"/>",
        frame.width - frame.right
    );
    let step = tick_step(span);
    let mut tick = 0.0;
    while tick <= span * 1.0001 {
        let x = left + tick / span * plot_w;
        let _ = writeln!(
            out,
            "<line class=\"axis\" x1=\"{x:.1}\" y1=\"{base:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            base + 4.0,
            base + 16.0,
            round_label(tick)
        );
        tick += step;
    }
    // Stream numbers down the left: every row when few, every tenth otherwise.
    let every = if streams.len() <= 30 { 1 } else { 10 };
    for (row, s) in streams.iter().enumerate().step_by(every) {
        let y = top + row as f64 * (lane_h + lane_gap) + lane_h;
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\" font-size=\"9\">{}</text>",
            left - 6.0,
            s.index
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time since the stream's intended start</text>",
        left + plot_w / 2.0,
        base + 30.0
    );
}

/// A count above its bar, so a single stall is as readable as a thousand steady gaps.
fn count_label(out: &mut String, x: f64, top: f64, count: u64) {
    let _ = writeln!(
        out,
        "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{count}</text>",
        top - 3.0
    );
}

/// The axis step: 1, 2 or 5 times a power of ten, giving at most 8 steps over `span` seconds.
fn tick_step(span: f64) -> f64 {
    let rough = span / 8.0;
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}

/// A round number of seconds as an axis label: `0`, `100us`, `20ms`, `1.5s`.
fn round_label(seconds: f64) -> String {
    let trim = |v: f64| {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    if seconds <= 0.0 {
        "0".to_owned()
    } else if seconds >= 1.0 {
        format!("{}s", trim(seconds))
    } else if seconds >= 1e-3 {
        format!("{}ms", trim(seconds * 1e3))
    } else {
        format!("{}us", trim(seconds * 1e6))
    }
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(
        || "–".to_owned(),
        |v| format_duration(Duration::from_secs_f64(v.max(0.0) / 1e3)),
    )
}

/// Escapes text for element content and attribute values.
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

/// Each phase's gap quantiles, as one cell of the summary table.
fn phase_itl(r: &Report) -> String {
    let phases: Vec<String> = r
        .phases
        .iter()
        .flatten()
        .map(|(phase, f)| {
            let ms = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1} ms"));
            format!(
                "{phase}: p50 {} · p99 {} ({} events)",
                ms(f.itl_ms.p50),
                ms(f.itl_ms.p99),
                f.token_events
            )
        })
        .collect();
    if phases.is_empty() {
        "–".to_owned()
    } else {
        phases.join("<br>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::stats::summarize;
    use crate::probe::stream::{StreamError, StreamRecord};

    #[test]
    fn page_is_self_contained_and_marks_stalls_and_clumps() {
        let t0 = Instant::now();
        let mut streams = Vec::new();
        for i in 0..(MAX_STRIPS as u64 + 5) {
            let mut s = StreamRecord::new(i, t0);
            let mut at = t0 + Duration::from_millis(40);
            for n in 0..20 {
                at += match n {
                    10 => Duration::from_millis(400),
                    5 => Duration::ZERO,
                    _ => Duration::from_millis(30),
                };
                s.token_times.push(at);
            }
            s.counted_tokens = 20;
            s.finished = Some(at);
            streams.push(s);
        }
        streams[3].error = Some(StreamError::Body("reset <by> peer".into()));
        let run = ProbeRun {
            started: t0,
            finished: t0 + Duration::from_secs(1),
            streams,
        };
        let report = summarize(&run, Duration::from_millis(200));
        let html = render_html(&run, &report, "http://127.0.0.1:1/v1/chat/completions?a&b");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.ends_with("</html>\n"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("src="));
        assert!(!html.contains("href="));
        assert!(!html.contains("@import"));
        assert!(html.contains("?a&amp;b"));
        assert!(html.contains("reset &lt;by&gt; peer"));
        assert!(html.contains("class=\"threshold\""));
        assert!(html.contains("class=\"gap\""));
        assert!(html.contains("class=\"clump\""));
        assert!(html.contains(&format!("Only the first {MAX_STRIPS} of 205 streams")));
        assert_eq!(html.matches("<g><title>stream").count(), MAX_STRIPS);
        assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
        assert!(!html.contains("Where the gaps come from"));
    }

    #[test]
    fn attribution_section_when_joined() {
        use crate::probe::attribution::{GapQuantiles, GapSplit, GapsAtPoints, Percentiles};
        let t0 = Instant::now();
        let run = ProbeRun {
            started: t0,
            finished: t0,
            streams: vec![],
        };
        let mut report = summarize(&run, Duration::from_millis(200));
        let mut a = Attribution {
            admin_url: "http://127.0.0.1:9464".into(),
            streams_joined: 2,
            ..Attribution::default()
        };
        a.gap_ms = Percentiles {
            p99: Some(GapSplit {
                client: 480.0,
                generation: 30.0,
                generation_batch: 0.0,
                generation_stream: 0.0,
                metronome: 0.0,
                after_metronome: 450.0,
            }),
            ..Percentiles::default()
        };
        let q = |p99| GapQuantiles {
            p50: Some(30.0),
            p99: Some(p99),
            p999: None,
        };
        a.gaps_at_points_ms = GapsAtPoints {
            ingress: q(30.0),
            egress: q(30.0),
            client: q(480.0),
        };
        a.streams_not_joined.fetch_error = 1;
        a.detail.examples.insert("fetch_error", "a <b>".into());
        report.attribution = Some(a);
        let html = render_html(&run, &report, "t");
        assert!(html.contains("<h2>Where the gaps come from</h2>"));
        assert!(html.contains("<tr><th>ITL p99</th><td class=\"n\">480.0ms</td>"));
        assert!(html.contains(
            "at ingress 30.00 / 30.00 / – ms, at egress 30.00 / 30.00 / – ms, at the client \
             30.00 / 480.00 / – ms."
        ));
        assert!(html.contains("fetch_error: a &lt;b&gt;"));
    }

    #[test]
    fn axis_labels_are_round() {
        assert_eq!(round_label(0.0), "0");
        assert_eq!(round_label(1e-3), "1ms");
        assert_eq!(round_label(0.2), "200ms");
        assert_eq!(round_label(1.5), "1.5s");
        assert_eq!(round_label(1e-4), "100us");
        assert_eq!(tick_step(1.57), 0.2);
        assert_eq!(tick_step(8.0), 1.0);
        assert!((tick_step(0.3) - 0.05).abs() < 1e-12);
    }
}
