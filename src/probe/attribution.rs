//! Where the client's gaps come from: the arithmetic of `probe --join`, on one stream's client
//! record and the proxy's timeline of the same stream.
//!
//! The client and metronome do not share a clock, so everything is relative:
//! - client times `c_k` count from the moment the probe sent the request; ingress `i_k` and egress
//!   `e_k` stamps count from the moment metronome received it (docs/timelines.md);
//! - events are matched by order: the k-th token event at the client is the k-th token event of
//!   the timeline (frames carry `token_events` counts; events of one frame share its stamps);
//!   matching stops at the shorter side and at the first token event that never left metronome;
//! - the **base delay** `d = min_k (c_k − e_k)` is the least time any matched event took from
//!   metronome's socket to the client, plus the request's trip to metronome; `c_k − d` is then the
//!   client arrival on metronome's clock, and `c_k − d − e_k ≥ 0` how long event k was held after
//!   metronome beyond that base.
//!
//! For each gap between token events k−1 and k:
//! - `client` `G = c_k − c_{k−1}`;
//! - `generation` `g = i_k − i_{k−1}`, the gap as the upstream produced it;
//! - `metronome` `m = (e_k − i_k) − (e_{k−1} − i_{k−1})`, the change in metronome's own delay;
//! - `after_metronome` `r = G − g − m`, the change in delay after metronome (network, a buffering
//!   edge, the client's reading). A clump has `r ≈ −g`; the gap that releases it a large `r`.
//!
//! `G = g + m + r` holds exactly for every gap. The first token event gets the same split from
//! the client's TTFT (from the intended start): `generation` is the ingress TTFT, `metronome` is
//! `e_0 − i_0`, `after_metronome` is `c_0 − d − e_0`, and `network` is the rest (the base delay
//! and any wait before the request was sent).

use std::time::Instant;

use serde::Serialize;

use super::stream::StreamRecord;
use crate::timeline_json::StreamTimeline;

/// One gap split into its parts, in microseconds. `client = generation + metronome + after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapParts {
    /// The gap at the client.
    pub client: i64,
    /// The ingress gap of the same two token events.
    pub generation: i64,
    /// The change in metronome's delay (egress − ingress) between them.
    pub metronome: i64,
    /// The rest: what happened after metronome.
    pub after_metronome: i64,
    /// The gap was a batch-wide hitch at ingress (`/streams/{id}` marks it `scope: batch`): its
    /// generation part is the batch's (another request's prefill), not the stream's own.
    pub batch: bool,
    /// The ingress gap overlapped a backpressure mark: the client held the stream back, so its
    /// generation part is the client's, not the engine's.
    pub held: bool,
}

/// The first token event's wait split into its parts, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtftParts {
    /// TTFT at the client, from the stream's intended start.
    pub client: i64,
    /// TTFT at ingress, from metronome's receipt of the request.
    pub generation: i64,
    /// Metronome's delay of the first token event (egress − ingress).
    pub metronome: i64,
    /// How long the first token event was held after metronome beyond the base delay.
    pub after_metronome: i64,
    /// The rest: the base delay and any wait before the request was sent.
    pub network: i64,
}

/// One stream joined with its timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedStream {
    /// Every matched gap, in order.
    pub gaps: Vec<GapParts>,
    /// The first token event's split.
    pub ttft: TtftParts,
    /// The base delay `min(c_k − e_k)`, microseconds.
    pub base_delay: i64,
    /// Token events matched (one more than `gaps.len()`).
    pub matched: usize,
    /// The client and the timeline counted different numbers of token events (the timeline's
    /// dropped frames aside): the match covers the shorter side.
    pub count_mismatch: bool,
}

/// Joins one client stream with its timeline; `None` when no token event can be matched.
pub fn join_stream(record: &StreamRecord, timeline: &StreamTimeline) -> Option<JoinedStream> {
    let origin = record.sent.unwrap_or(record.scheduled);
    let client: Vec<i64> = record
        .token_times
        .iter()
        .map(|t| micros_since(origin, *t))
        .collect();
    let stamps: Vec<(i64, i64)> = timeline
        .token_stamps()
        .map_while(|(ingress, egress)| Some((to_i64(ingress), to_i64(egress?))))
        .take(client.len())
        .collect();
    let matched = stamps.len();
    if matched == 0 {
        return None;
    }
    let base_delay = client.iter().zip(&stamps).map(|(c, (_, e))| c - e).min()?;
    let gaps = (1..matched)
        .map(|k| {
            let client = client[k] - client[k - 1];
            let (i0, e0) = stamps[k - 1];
            let (i1, e1) = stamps[k];
            let generation = i1 - i0;
            let metronome = (e1 - i1) - (e0 - i0);
            GapParts {
                client,
                generation,
                metronome,
                after_metronome: client - generation - metronome,
                batch: timeline.batch_hitch(k as u64),
                held: timeline.held_back(to_u64(i0), to_u64(i1)),
            }
        })
        .collect();
    let (i0, e0) = stamps[0];
    let client_ttft = micros_since(record.scheduled, record.token_times[0]);
    let after_metronome = client[0] - base_delay - e0;
    let ttft = TtftParts {
        client: client_ttft,
        generation: i0,
        metronome: e0 - i0,
        after_metronome,
        network: client_ttft - e0 - after_metronome,
    };
    let timeline_complete = timeline.frames_dropped == 0;
    let count_mismatch = timeline_complete
        && u64::try_from(record.token_times.len()).ok() != Some(timeline.token_events());
    Some(JoinedStream {
        gaps,
        ttft,
        base_delay,
        matched,
        count_mismatch,
    })
}

/// Microseconds from `origin` to `t` (0 if `t` is earlier).
fn micros_since(origin: Instant, t: Instant) -> i64 {
    to_i64_u128(t.saturating_duration_since(origin).as_micros())
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_i64_u128(v: u128) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The attribution of a whole run: what `probe --join` adds to the report (the JSON
/// `attribution` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Attribution {
    /// The admin listener the timelines were fetched from.
    pub admin_url: String,
    /// Streams whose timeline was fetched and matched.
    pub streams_joined: u64,
    /// Streams that could not be joined, by reason.
    pub streams_not_joined: NotJoined,
    /// Joined streams whose token-event counts differ between client and timeline.
    pub token_count_mismatches: u64,
    /// Matched gaps, pooled over joined streams.
    pub gaps: u64,
    /// The client's gap percentiles (nearest rank over the matched gaps), each split into its parts.
    pub gap_ms: Percentiles<GapSplit>,
    /// The client's stalls (gaps over the probe's stall threshold), each given to the part that
    /// made most of it, generation split into the batch's and the stream's own.
    pub stalls: StallSplit,
    /// The matched gaps at ingress, at egress and at the client, each point ranked on its own:
    /// where a tail is born.
    pub gaps_at_points_ms: GapsAtPoints,
    /// The client's TTFT percentiles over joined streams, each split into its parts.
    pub ttft_ms: Percentiles<TtftSplit>,
    /// Of all the time the client waited between token events, the share metronome added and
    /// the share added after metronome (sums of the positive parts over the sum of client gaps).
    pub wait_share: WaitShare,
    /// The per-stream base delay (request trip plus the least return trip), in milliseconds.
    pub base_delay_ms: MedianMax,
    /// Events per client read against events per upstream frame.
    pub clumping: Clumping,
    /// Context for the human-readable reports.
    #[serde(skip)]
    pub detail: AttributionDetail,
}

/// p50, p95 and p99 of some split, `None` without data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles<T> {
    /// Median.
    pub p50: Option<T>,
    /// 95th percentile.
    pub p95: Option<T>,
    /// 99th percentile.
    pub p99: Option<T>,
}

/// The matched gaps as each point saw them, each point's gaps ranked on their own (nearest rank),
/// in milliseconds. `gap_ms` splits one pair of token events at each percentile, which says what
/// made that pair's gap; these say where a tail is born. An ingress p99 as high as the client's
/// was there before metronome read the events (the upstream, or the path and the machine between
/// it and metronome); a client p99 above the egress p99 was added after metronome wrote them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GapsAtPoints {
    /// Gaps between the token events' ingress stamps (as metronome read them): `generation`.
    pub ingress: GapQuantiles,
    /// Gaps between their egress stamps (as metronome wrote them): `generation + metronome`.
    pub egress: GapQuantiles,
    /// The same gaps at the client: `client`.
    pub client: GapQuantiles,
}

/// p50, p99 and p99.9 (nearest rank) of one point's gaps, in milliseconds; `None` without gaps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GapQuantiles {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
}

impl GapQuantiles {
    /// `p50 / p99 / p99.9 ms` to two decimals, `missing` in place of an absent figure: how the
    /// text and HTML reports print a point (a tail born between two points is often a few
    /// hundred µs, below the reports' usual precision).
    pub fn as_ms_text(&self, missing: &str) -> String {
        let figure = |v: Option<f64>| v.map_or_else(|| missing.to_owned(), |v| format!("{v:.2}"));
        let figures = [self.p50, self.p99, self.p999].map(figure).join(" / ");
        format!("{figures} ms")
    }

    /// The quantiles of `gaps_us` (any order).
    fn of(mut gaps_us: Vec<i64>) -> Self {
        gaps_us.sort_unstable();
        let per_mille = |p| super::stats::nearest_rank_per_mille(&gaps_us, p).map(ms);
        GapQuantiles {
            p50: per_mille(500),
            p99: per_mille(990),
            p999: per_mille(999),
        }
    }
}

/// The client's stalls by the part that made most of each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StallSplit {
    /// The stall threshold, milliseconds.
    pub threshold_ms: f64,
    /// Client gaps over it.
    pub stalls: u64,
    /// Of those, mostly generation in a batch-wide hitch (another request's prefill).
    pub generation_batch: u64,
    /// Mostly generation otherwise (the stream's own).
    pub generation_stream: u64,
    /// Mostly an ingress gap while the client held the stream back (backpressure): not the
    /// engine's.
    pub held_by_client: u64,
    /// Mostly metronome.
    pub metronome: u64,
    /// Mostly after metronome.
    pub after_metronome: u64,
}

/// [`GapParts`] in milliseconds, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GapSplit {
    /// The gap at the client.
    pub client: f64,
    /// The ingress gap of the same token events.
    pub generation: f64,
    /// `generation` when the gap was a batch-wide hitch, else 0.
    pub generation_batch: f64,
    /// `generation` otherwise (the stream's own), else 0.
    pub generation_stream: f64,
    /// What metronome added (or took away).
    pub metronome: f64,
    /// What happened after metronome.
    pub after_metronome: f64,
}

/// [`TtftParts`] in milliseconds, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TtftSplit {
    /// TTFT at the client.
    pub client: f64,
    /// TTFT at ingress.
    pub generation: f64,
    /// Metronome's delay of the first token event.
    pub metronome: f64,
    /// Held after metronome beyond the base delay.
    pub after_metronome: f64,
    /// The base delay and any wait before sending.
    pub network: f64,
}

/// Shares (0–1) of the client's total waiting between token events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WaitShare {
    /// Added by metronome.
    pub metronome: Option<f64>,
    /// Added after metronome.
    pub after_metronome: Option<f64>,
}

/// Streams that could not be joined, by reason. None of them fails the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NotJoined {
    /// The response carried no stream ID header (not metered, or the header is turned off).
    pub no_stream_id: u64,
    /// The admin listener does not know the ID (it left the ring, or another proxy served it).
    pub not_found: u64,
    /// The timeline could not be fetched or read.
    pub fetch_error: u64,
    /// No token event could be matched (none on one side, or none reached the client socket).
    pub no_token_events: u64,
}

/// The median and the largest of a per-stream figure, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MedianMax {
    /// Median stream.
    pub p50: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// The mean and the p95 of a count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MeanP95 {
    /// Mean.
    pub mean: Option<f64>,
    /// 95th percentile (nearest rank).
    pub p95: Option<f64>,
}

/// Clumping: how many events arrive together at the client against how many the upstream sent
/// together. Reads and frames that complete no event are left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Clumping {
    /// Events per client read (mean and p95), joined streams.
    pub events_per_read: MeanP95,
    /// Events per upstream frame (mean and p95), from the same streams' timelines.
    pub events_per_frame: MeanP95,
}

/// What the text and HTML reports show beyond the JSON.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttributionDetail {
    /// The first message of each reason a stream was not joined.
    pub examples: std::collections::BTreeMap<&'static str, String>,
    /// Sum of the client's gaps, milliseconds.
    pub client_wait_ms: f64,
}

/// Why one stream could not be joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unjoined {
    /// No stream ID header.
    NoStreamId,
    /// 404 from the admin listener.
    NotFound(String),
    /// Anything else that went wrong fetching or reading the timeline.
    FetchError(String),
}

/// One matched gap, where and when it happened: a row of `probe --gaps-csv`, for an analysis
/// the report does not make (which gaps were late together, and when).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapRow {
    /// The stream's index in the run (the probe's start order).
    pub stream: u64,
    /// The later token event of the gap (1 is the gap between the first two).
    pub event: usize,
    /// When that token event reached the client, microseconds from the run's start.
    pub client_at_us: i64,
    /// The gap and its parts.
    pub parts: GapParts,
}

/// The header of `probe --gaps-csv`, matching [`GapRow::csv_line`].
pub const GAP_ROWS_CSV_HEADER: &str =
    "stream,event,client_at_us,client_us,generation_us,metronome_us,after_metronome_us\n";

impl GapRow {
    /// The row as a CSV line (with its newline), in [`GAP_ROWS_CSV_HEADER`]'s order.
    pub fn csv_line(&self) -> String {
        let mut line = String::new();
        self.write_csv(&mut line);
        line
    }

    /// Appends the row as a CSV line (with its newline) to `out`.
    fn write_csv(&self, out: &mut String) {
        use std::fmt::Write as _;
        let p = &self.parts;
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{}",
            self.stream,
            self.event,
            self.client_at_us,
            p.client,
            p.generation,
            p.metronome,
            p.after_metronome
        );
    }
}

/// The whole text of `probe --gaps-csv`: the header, then one line per row, built in one string
/// (a run can have hundreds of thousands of rows).
pub fn gaps_csv(rows: &[GapRow]) -> String {
    // About 40 bytes a row.
    let mut csv = String::with_capacity(GAP_ROWS_CSV_HEADER.len() + rows.len() * 40);
    csv.push_str(GAP_ROWS_CSV_HEADER);
    for row in rows {
        row.write_csv(&mut csv);
    }
    csv
}

/// Builds the run's attribution from each stream's join (or why it was not joined) and the
/// timelines' frames (for clumping).
#[derive(Debug, Default)]
pub struct AttributionBuilder {
    attribution: Attribution,
    gaps: Vec<GapParts>,
    /// With [`AttributionBuilder::keeping_rows`]: the run's start and every gap's row.
    rows: Option<(Instant, Vec<GapRow>)>,
    ttfts: Vec<TtftParts>,
    base_delays: Vec<i64>,
    read_events: Vec<u32>,
    frame_events: Vec<u32>,
    /// The client gap over which a gap is a stall, microseconds (0: the default, 200 ms).
    stall_us: i64,
}

// === impl AttributionBuilder ===

impl AttributionBuilder {
    /// A builder for timelines fetched from `admin_url`.
    pub fn new(admin_url: &str) -> Self {
        AttributionBuilder {
            attribution: Attribution {
                admin_url: admin_url.to_owned(),
                ..Attribution::default()
            },
            ..AttributionBuilder::default()
        }
    }

    /// Counts the client's gaps longer than `threshold` as stalls (default 200 ms).
    pub fn stall_threshold(mut self, threshold: std::time::Duration) -> Self {
        self.stall_us = to_i64_u128(threshold.as_micros());
        self
    }

    /// Also keeps every matched gap as a [`GapRow`], timed from `run_started`
    /// ([`AttributionBuilder::take_rows`]).
    pub fn keeping_rows(mut self, run_started: Instant) -> Self {
        self.rows = Some((run_started, Vec::new()));
        self
    }

    /// The rows kept so far (empty without [`AttributionBuilder::keeping_rows`]).
    pub fn take_rows(&mut self) -> Vec<GapRow> {
        self.rows
            .as_mut()
            .map(|(_, rows)| std::mem::take(rows))
            .unwrap_or_default()
    }

    /// Adds a stream whose timeline was fetched.
    pub fn joined(&mut self, record: &StreamRecord, timeline: &StreamTimeline) {
        let Some(joined) = join_stream(record, timeline) else {
            self.attribution.streams_not_joined.no_token_events += 1;
            return;
        };
        if let Some((started, rows)) = &mut self.rows {
            // Gap k - 1 ends at token event k; `join_stream` matched events in order.
            rows.extend(joined.gaps.iter().enumerate().map(|(k, parts)| GapRow {
                stream: record.index,
                event: k + 1,
                client_at_us: micros_since(*started, record.token_times[k + 1]),
                parts: *parts,
            }));
        }
        self.attribution.streams_joined += 1;
        self.attribution.token_count_mismatches += u64::from(joined.count_mismatch);
        self.gaps.extend_from_slice(&joined.gaps);
        self.ttfts.push(joined.ttft);
        self.base_delays.push(joined.base_delay);
        self.read_events.extend(
            record
                .reads
                .iter()
                .map(|r| r.events)
                .filter(|events| *events > 0),
        );
        self.frame_events.extend(
            timeline
                .frames
                .iter()
                .map(|f| f.events)
                .filter(|events| *events > 0),
        );
    }

    /// Adds a stream that could not be joined.
    pub fn not_joined(&mut self, why: Unjoined) {
        let n = &mut self.attribution.streams_not_joined;
        let (kind, message) = match why {
            Unjoined::NoStreamId => {
                n.no_stream_id += 1;
                ("no_stream_id", None)
            }
            Unjoined::NotFound(m) => {
                n.not_found += 1;
                ("not_found", Some(m))
            }
            Unjoined::FetchError(m) => {
                n.fetch_error += 1;
                ("fetch_error", Some(m))
            }
        };
        if let Some(message) = message {
            self.attribution
                .detail
                .examples
                .entry(kind)
                .or_insert(message);
        }
    }

    /// The attribution of everything added.
    pub fn finish(mut self) -> Attribution {
        let a = &mut self.attribution;
        a.gaps = self.gaps.len() as u64;
        let stall_us = if self.stall_us > 0 {
            self.stall_us
        } else {
            200_000
        };
        a.stalls = stall_split(&self.gaps, stall_us);
        // Stable: ties keep stream and event order, so the chosen pair is reproducible.
        self.gaps.sort_by_key(|g| g.client);
        let gap = |p| nearest(&self.gaps, p).map(gap_split);
        a.gap_ms = Percentiles {
            p50: gap(50),
            p95: gap(95),
            p99: gap(99),
        };
        self.ttfts.sort_by_key(|t| t.client);
        let ttft = |p| nearest(&self.ttfts, p).map(ttft_split);
        a.ttft_ms = Percentiles {
            p50: ttft(50),
            p95: ttft(95),
            p99: ttft(99),
        };
        let point =
            |part: fn(&GapParts) -> i64| GapQuantiles::of(self.gaps.iter().map(part).collect());
        a.gaps_at_points_ms = GapsAtPoints {
            ingress: point(|g| g.generation),
            egress: point(|g| g.generation + g.metronome),
            client: point(|g| g.client),
        };
        let total: i64 = self.gaps.iter().map(|g| g.client).sum();
        let positive =
            |part: fn(&GapParts) -> i64| -> i64 { self.gaps.iter().map(|g| part(g).max(0)).sum() };
        let share = |sum: i64| (total > 0).then(|| sum as f64 / total as f64);
        a.wait_share = WaitShare {
            metronome: share(positive(|g| g.metronome)),
            after_metronome: share(positive(|g| g.after_metronome)),
        };
        a.detail.client_wait_ms = ms(total);
        self.base_delays.sort_unstable();
        a.base_delay_ms = MedianMax {
            p50: nearest(&self.base_delays, 50).map(ms),
            max: self.base_delays.last().copied().map(ms),
        };
        a.clumping = Clumping {
            events_per_read: mean_and_p95(&mut self.read_events),
            events_per_frame: mean_and_p95(&mut self.frame_events),
        };
        self.attribution
    }
}

fn nearest<T: Copy>(sorted: &[T], percent: u32) -> Option<T> {
    super::stats::nearest_rank(sorted, percent)
}

fn mean_and_p95(values: &mut [u32]) -> MeanP95 {
    values.sort_unstable();
    let sum: u64 = values.iter().map(|v| u64::from(*v)).sum();
    MeanP95 {
        mean: (!values.is_empty()).then(|| sum as f64 / values.len() as f64),
        p95: nearest(values, 95).map(f64::from),
    }
}

/// Microseconds to milliseconds (exact to the microsecond).
fn ms(us: i64) -> f64 {
    us as f64 / 1e3
}

/// Each client gap over `stall_us` given to its largest part.
fn stall_split(gaps: &[GapParts], stall_us: i64) -> StallSplit {
    let mut split = StallSplit {
        threshold_ms: ms(stall_us),
        ..StallSplit::default()
    };
    for g in gaps.iter().filter(|g| g.client > stall_us) {
        split.stalls += 1;
        let largest = g.generation.max(g.metronome).max(g.after_metronome);
        if g.generation == largest {
            if g.held {
                split.held_by_client += 1;
            } else if g.batch {
                split.generation_batch += 1;
            } else {
                split.generation_stream += 1;
            }
        } else if g.metronome == largest {
            split.metronome += 1;
        } else {
            split.after_metronome += 1;
        }
    }
    split
}

fn gap_split(g: GapParts) -> GapSplit {
    let (batch, stream) = if g.batch {
        (g.generation, 0)
    } else {
        (0, g.generation)
    };
    GapSplit {
        client: ms(g.client),
        generation: ms(g.generation),
        generation_batch: ms(batch),
        generation_stream: ms(stream),
        metronome: ms(g.metronome),
        after_metronome: ms(g.after_metronome),
    }
}

fn ttft_split(t: TtftParts) -> TtftSplit {
    TtftSplit {
        client: ms(t.client),
        generation: ms(t.generation),
        metronome: ms(t.metronome),
        after_metronome: ms(t.after_metronome),
        network: ms(t.network),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::probe::stream::Read;
    use crate::timeline_json::TimelineFrame;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn frame(ingress_us: u64, egress_us: u64, events: u32, token_events: u32) -> TimelineFrame {
        TimelineFrame {
            ingress_us,
            egress_us: Some(egress_us),
            bytes: Some(200),
            events,
            token_events,
        }
    }

    #[test]
    fn the_gap_csv_is_the_header_then_one_line_per_row_in_order() {
        let row = |stream, event, client_at_us, client, generation, metronome| GapRow {
            stream,
            event,
            client_at_us,
            parts: GapParts {
                client,
                generation,
                metronome,
                after_metronome: client - generation - metronome,
                batch: false,
                held: false,
            },
        };
        let rows = [
            row(0, 1, 150_000, 50_000, 50_000, 0),
            // Metronome gave back 12 µs it had held, and the client read 30 µs early.
            row(0, 2, 199_958, 49_958, 50_000, -12),
            row(7, 1, 2_000_123, 230_004, 229_990, 3),
        ];
        assert_eq!(
            gaps_csv(&rows),
            "stream,event,client_at_us,client_us,generation_us,metronome_us,after_metronome_us\n\
             0,1,150000,50000,50000,0,0\n\
             0,2,199958,49958,50000,-12,-30\n\
             7,1,2000123,230004,229990,3,11\n"
        );
        assert_eq!(rows[2].csv_line(), "7,1,2000123,230004,229990,3,11\n");
        assert_eq!(gaps_csv(&[]), GAP_ROWS_CSV_HEADER);
    }

    fn timeline(frames: Vec<TimelineFrame>) -> StreamTimeline {
        StreamTimeline {
            hitches: Vec::new(),
            backpressure: Vec::new(),
            id: "s".into(),
            route: None,
            model: None,
            outcome: None,
            content_type: None,
            frames,
            frames_dropped: 0,
        }
    }

    /// A client record sent at `t0 + 1ms` whose token events arrive at these offsets from the send.
    fn client(t0: Instant, arrivals_us: &[u64]) -> StreamRecord {
        let mut r = StreamRecord::new(0, t0);
        let sent = t0 + us(1_000);
        r.sent = Some(sent);
        r.token_times = arrivals_us.iter().map(|a| sent + us(*a)).collect();
        r
    }

    #[test]
    fn each_point_ranks_its_own_gaps() {
        // 101 token frames 30 ms apart. The upstream sends the 51st 5 ms late, metronome holds
        // the 81st 2 ms, and the client reads the 91st 1 ms late; every other frame reaches the
        // client 300 us after metronome wrote it.
        let t0 = Instant::now();
        let mut frames = Vec::new();
        let mut arrivals = Vec::new();
        for k in 0..101u64 {
            let ingress = 30_000 * (k + 1) + if k == 50 { 5_000 } else { 0 };
            let egress = ingress + 10 + if k == 80 { 2_000 } else { 0 };
            frames.push(frame(ingress, egress, 1, 1));
            arrivals.push(egress + 300 + if k == 90 { 1_000 } else { 0 });
        }
        let mut b = AttributionBuilder::new("http://a");
        b.joined(&client(t0, &arrivals), &timeline(frames));
        let a = b.finish();
        assert_eq!(a.gaps, 100);
        // Sorted, ingress: 25, 98 x 30, 35. Egress adds 28 and 32 in place of two 30s; the
        // client adds 29 and 31 as well. p99 is the 99th of 100, p99.9 the 100th.
        let at = a.gaps_at_points_ms;
        let all = |q: GapQuantiles| (q.p50, q.p99, q.p999);
        assert_eq!(all(at.ingress), (Some(30.0), Some(30.0), Some(35.0)));
        assert_eq!(all(at.egress), (Some(30.0), Some(32.0), Some(35.0)));
        assert_eq!(all(at.client), (Some(30.0), Some(32.0), Some(35.0)));
        let text = crate::probe::report_text::render_attribution(&a);
        assert!(
            text.contains(
                "  gaps alone   p50 / p99 / p99.9 at ingress 30.00 / 30.00 / 35.00 ms, \
                 at egress 30.00 / 32.00 / 35.00 ms, at the client 30.00 / 32.00 / 35.00 ms\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_buffering_edge_shows_after_metronome() {
        let t0 = Instant::now();
        // Upstream: role frame, then 4 token frames every 30 ms; metronome adds 0.1 ms each.
        let tl = timeline(vec![
            frame(10_000, 10_100, 1, 0),
            frame(40_000, 40_100, 1, 1),
            frame(70_000, 70_100, 1, 1),
            frame(100_000, 100_100, 1, 1),
            frame(130_000, 130_100, 1, 1),
        ]);
        // The client (base delay 500 us) gets the first two at once, 30 ms late, then the next
        // two on time.
        let rec = client(t0, &[70_600, 70_600, 100_600, 130_600]);
        let j = join_stream(&rec, &tl).unwrap();
        assert_eq!(j.matched, 4);
        assert!(!j.count_mismatch);
        assert_eq!(j.base_delay, 500);
        assert_eq!(
            j.gaps,
            [
                GapParts {
                    client: 0,
                    generation: 30_000,
                    metronome: 0,
                    after_metronome: -30_000,
                    batch: false,
                    held: false,
                },
                GapParts {
                    client: 30_000,
                    generation: 30_000,
                    metronome: 0,
                    after_metronome: 0,
                    batch: false,
                    held: false,
                },
                GapParts {
                    client: 30_000,
                    generation: 30_000,
                    metronome: 0,
                    after_metronome: 0,
                    batch: false,
                    held: false,
                },
            ]
        );
        // TTFT: 1 ms before sending, then 40 ms to ingress, 0.1 ms in metronome, held 30 ms,
        // 0.5 ms base delay.
        assert_eq!(
            j.ttft,
            TtftParts {
                client: 71_600,
                generation: 40_000,
                metronome: 100,
                after_metronome: 30_000,
                network: 1_500,
            }
        );
    }

    #[test]
    fn a_gap_overlapping_backpressure_is_held_by_the_client_not_generation() {
        let t0 = Instant::now();
        let mut tl = timeline(vec![
            frame(10_000, 10_100, 1, 1),
            frame(40_000, 40_100, 1, 1),
            frame(3_040_000, 3_040_100, 1, 1),
            frame(3_070_000, 3_070_100, 1, 1),
            frame(3_570_000, 3_570_100, 1, 1),
        ]);
        // The client held the stream back from 45 ms to 3.03 s; the last gap is the engine's.
        tl.backpressure = vec![crate::timeline_json::TimelineBackpressure {
            from_us: 45_000,
            to_us: 3_030_000,
            held_us: 2_985_000,
        }];
        let rec = client(t0, &[10_300, 40_300, 3_040_300, 3_070_300, 3_570_300]);
        let j = join_stream(&rec, &tl).unwrap();
        let held: Vec<bool> = j.gaps.iter().map(|g| g.held).collect();
        assert_eq!(held, [false, true, false, false]);
        let mut b = AttributionBuilder::new("http://a").stall_threshold(Duration::from_millis(250));
        b.joined(&rec, &tl);
        let a = b.finish();
        assert_eq!((a.stalls.stalls, a.stalls.held_by_client), (2, 1));
        assert_eq!(a.stalls.generation_stream, 1);
    }

    #[test]
    fn a_gap_the_timeline_marks_batch_is_the_batchs_generation_and_stall() {
        let t0 = Instant::now();
        let mut tl = timeline(vec![
            frame(10_000, 10_100, 1, 1),
            frame(40_000, 40_100, 1, 1),
            frame(440_000, 440_100, 1, 1),
            frame(470_000, 470_100, 1, 1),
            frame(770_000, 770_100, 1, 1),
        ]);
        // Token event 2's gap was the batch's (a prefill held the step); 4's was the stream's.
        tl.hitches = vec![
            crate::timeline_json::TimelineHitch {
                event: 2,
                scope: "batch".into(),
                episode: Some(1),
            },
            crate::timeline_json::TimelineHitch {
                event: 4,
                scope: "stream".into(),
                episode: None,
            },
        ];
        let rec = client(t0, &[10_300, 40_300, 440_300, 470_300, 770_300]);
        let j = join_stream(&rec, &tl).unwrap();
        let batch: Vec<bool> = j.gaps.iter().map(|g| g.batch).collect();
        assert_eq!(batch, [false, true, false, false]);
        let mut b = AttributionBuilder::new("http://a").stall_threshold(Duration::from_millis(250));
        b.joined(&rec, &tl);
        let a = b.finish();
        assert_eq!(
            a.stalls,
            StallSplit {
                threshold_ms: 250.0,
                stalls: 2,
                generation_batch: 1,
                generation_stream: 1,
                held_by_client: 0,
                metronome: 0,
                after_metronome: 0,
            }
        );
        let p99 = a.gap_ms.p99.unwrap();
        assert_eq!(
            (p99.client, p99.generation_batch, p99.generation_stream),
            (400.0, 400.0, 0.0)
        );
        let p50 = a.gap_ms.p50.unwrap();
        assert_eq!((p50.generation_batch, p50.generation_stream), (0.0, 30.0));
    }

    #[test]
    fn metronome_delay_is_its_own_part() {
        let t0 = Instant::now();
        let tl = timeline(vec![frame(1_000, 1_050, 1, 1), frame(2_000, 12_000, 2, 2)]);
        let rec = client(t0, &[1_250, 12_200, 12_200]);
        let j = join_stream(&rec, &tl).unwrap();
        assert_eq!(j.base_delay, 200);
        assert_eq!(
            j.gaps[0],
            GapParts {
                client: 10_950,
                generation: 1_000,
                metronome: 9_950,
                after_metronome: 0,
                batch: false,
                held: false,
            }
        );
        assert_eq!(j.gaps[1].client, 0);
        assert_eq!(j.gaps[1].generation, 0);
    }

    #[test]
    fn matching_stops_at_the_shorter_side_and_at_events_never_sent() {
        let t0 = Instant::now();
        let mut tl = timeline(vec![frame(1_000, 1_100, 1, 1), frame(2_000, 2_100, 1, 1)]);
        tl.frames.push(TimelineFrame {
            egress_us: None,
            ..frame(3_000, 0, 1, 1)
        });
        let rec = client(t0, &[1_300, 2_300, 3_300, 4_300]);
        let j = join_stream(&rec, &tl).unwrap();
        assert_eq!(j.matched, 2);
        assert!(j.count_mismatch);
        let none = client(t0, &[]);
        assert_eq!(join_stream(&none, &tl), None);
    }

    #[test]
    fn the_run_pools_gaps_and_picks_percentile_pairs() {
        let t0 = Instant::now();
        let mut b = AttributionBuilder::new("http://a");
        // 10 streams: a role frame, then 11 token frames 30 ms apart. An edge holds token events
        // 5, 6 and 7 until 8 arrives and releases the four as one read: a 120 ms gap, then three
        // gaps of 0. The base delay is 300 us (metronome adds 10 us to every frame).
        for _ in 0..10 {
            let mut frames = vec![frame(0, 10, 1, 0)];
            let mut arrivals = Vec::new();
            for k in 0..11u64 {
                frames.push(frame(30_000 * (k + 1), 30_000 * (k + 1) + 10, 1, 1));
                let released = if (5..=8).contains(&k) { 9 } else { k + 1 };
                arrivals.push(30_000 * released + 310);
            }
            let mut rec = client(t0, &arrivals);
            rec.reads = arrivals
                .iter()
                .enumerate()
                .filter(|(k, _)| !(6..=8).contains(k))
                .map(|(k, a)| {
                    let n = if k == 5 { 4 } else { 1 };
                    Read {
                        at: t0 + us(*a),
                        events: n,
                        token_events: n,
                    }
                })
                .collect();
            b.joined(&rec, &timeline(frames));
        }
        b.not_joined(Unjoined::NoStreamId);
        b.not_joined(Unjoined::NotFound("404 for abc".into()));
        let a = b.finish();
        assert_eq!(a.streams_joined, 10);
        assert_eq!(a.token_count_mismatches, 0);
        assert_eq!(a.streams_not_joined.no_stream_id, 1);
        assert_eq!(a.streams_not_joined.not_found, 1);
        assert_eq!(a.detail.examples["not_found"], "404 for abc");
        assert_eq!(a.gaps, 100);
        // Sorted: 30 clumps (0), 60 gaps of 30 ms, 10 of 120 ms.
        let p50 = a.gap_ms.p50.unwrap();
        assert_eq!(
            (
                p50.client,
                p50.generation,
                p50.metronome,
                p50.after_metronome
            ),
            (30.0, 30.0, 0.0, 0.0)
        );
        for p99 in [a.gap_ms.p95.unwrap(), a.gap_ms.p99.unwrap()] {
            assert_eq!(
                (
                    p99.client,
                    p99.generation,
                    p99.metronome,
                    p99.after_metronome
                ),
                (120.0, 30.0, 0.0, 90.0)
            );
        }
        // Client waiting: 300 ms of gaps per stream, 90 ms of it added after metronome.
        assert_eq!(a.detail.client_wait_ms, 3000.0);
        assert_eq!(a.wait_share.metronome, Some(0.0));
        assert!((a.wait_share.after_metronome.unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(a.base_delay_ms.p50, Some(0.3));
        assert_eq!(a.base_delay_ms.max, Some(0.3));
        // TTFT: 1 ms before sending, 30 ms to ingress, 10 us in metronome, nothing held.
        let ttft = a.ttft_ms.p50.unwrap();
        assert_eq!(
            (
                ttft.client,
                ttft.generation,
                ttft.metronome,
                ttft.after_metronome,
                ttft.network
            ),
            (31.31, 30.0, 0.01, 0.0, 1.3)
        );
        // 8 reads per stream, one of them four events; 12 frames of one event.
        assert_eq!(a.clumping.events_per_read.mean, Some(11.0 / 8.0));
        assert_eq!(a.clumping.events_per_read.p95, Some(4.0));
        assert_eq!(a.clumping.events_per_frame.mean, Some(1.0));
        assert_eq!(a.clumping.events_per_frame.p95, Some(1.0));
        // Each point alone: the upstream and metronome kept the 30 ms cadence; the edge made the
        // client's tail.
        let at = a.gaps_at_points_ms;
        let all = |q: GapQuantiles| (q.p50, q.p99, q.p999);
        assert_eq!(all(at.ingress), (Some(30.0), Some(30.0), Some(30.0)));
        assert_eq!(all(at.egress), (Some(30.0), Some(30.0), Some(30.0)));
        assert_eq!(all(at.client), (Some(30.0), Some(120.0), Some(120.0)));
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["gap_ms"]["p99"]["after_metronome"], 90.0);
        assert_eq!(json["gaps_at_points_ms"]["client"]["p99"], 120.0);
        assert_eq!(json["streams_not_joined"]["not_found"], 1);
        assert_eq!(
            json["clumping"]["events_per_read"],
            serde_json::json!({"mean": 1.375, "p95": 4.0})
        );
    }

    #[test]
    fn nothing_joined_is_null() {
        let a = AttributionBuilder::new("http://a").finish();
        let json = serde_json::to_value(&a).unwrap();
        assert!(json["gap_ms"]["p50"].is_null());
        assert!(json["wait_share"]["after_metronome"].is_null());
        assert!(json["clumping"]["events_per_read"]["mean"].is_null());
        assert!(json["base_delay_ms"]["p50"].is_null());
        assert!(json["gaps_at_points_ms"]["client"]["p99"].is_null());
        assert_eq!(json["streams_joined"], 0);
        assert!(!crate::probe::report_text::render_attribution(&a).contains("gaps alone"));
    }
}
