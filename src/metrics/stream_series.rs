//! The series a stream's figures go to, found once per (route, model) and kept.
//!
//! Why: a stream merges its figures into about sixteen histogram series (TTFB, TTFT, TTFO and
//! the gaps at two points, events per frame, tokens per event, TPOT, its duration …) and counts
//! itself in a few counters, each found by its label values: a hash, a lock, a comparison of the
//! values, about 300 instructions a time for a histogram and more for the `prometheus` crate's
//! counters, on every stream's flush and again at its end. Every stream of a (route, model)
//! pair goes to the same series, so one lookup of the pair gives a [`StreamSeries`] whose slots
//! hold each series once it was first used.
//!
//! Invariants: a slot is filled on first use, through the family's own lookup, so a series is
//! made (and exported) exactly when it would be without the bundle, and never before (a caller
//! that may have nothing to merge checks before it asks for the slot); the map
//! holds one bundle per (route, model) pair, which is bounded by the routes the configuration
//! names and the capped model labels (series are never removed, so neither are bundles).

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus::IntCounter;

use super::histogram::{find_or_make, hash_labels, LabelMap, SeriesHandle};
use super::{HistogramFamily, Metrics, Point};
use crate::format::Phase;
use crate::poison::LockExt;

/// Points a stream is measured at ([`Point`]).
const POINTS: usize = 3;
/// Phases a gap is counted in ([`Phase`]).
const PHASES: usize = 3;

/// The families with a series per point.
#[derive(Clone, Copy)]
enum PerPoint {
    Ttft,
    Ttfo,
    ReasoningDuration,
    Ttfb,
    EventsPerFrame,
}

/// The families with a series per point and phase.
#[derive(Clone, Copy)]
enum PerPhase {
    Itl,
    StallDuration,
    Jank,
}

/// The families with one series per (route, model) pair (or per route).
#[derive(Clone, Copy)]
enum PerStream {
    TokensPerEvent,
    Tpot,
    RequestTokensInput,
    RequestTokensOutput,
    RequestDuration,
    ProxyDelay,
}

const PER_POINT: usize = 5;
const PER_PHASE: usize = 3;
const PER_STREAM: usize = 6;
const SLOTS: usize = PER_POINT * POINTS + PER_PHASE * POINTS * PHASES + PER_STREAM;

/// The series of one (route, model) pair, each found on its first use.
#[derive(Debug)]
pub struct StreamSeries {
    route: Box<str>,
    model: Box<str>,
    histograms: [OnceLock<SeriesHandle>; SLOTS],
    stalls: [OnceLock<IntCounter>; POINTS * PHASES],
    prompt_tokens: OnceLock<IntCounter>,
    reasoning_tokens: OnceLock<IntCounter>,
    /// `metronome_streams_total` by outcome and finish reason.
    streams: Few<2>,
    /// `metronome_output_tokens_total` by source.
    output_tokens: Few<1>,
    /// `metronome_stream_format_total` by format (per route).
    stream_format: Few<1>,
}

/// Counters of a (route, model) pair whose other `N` labels take a few fixed values (an outcome
/// and a finish reason, a token source, a format): each found by all its label values on first
/// use, then by the fixed ones alone, among the few a pair's streams have had.
#[derive(Debug)]
struct Few<const N: usize> {
    found: Mutex<Vec<([&'static str; N], IntCounter)>>,
}

impl<const N: usize> Default for Few<N> {
    fn default() -> Self {
        Few {
            found: Mutex::new(Vec::new()),
        }
    }
}

impl<const N: usize> Few<N> {
    /// Adds `n` to the counter of `values`, which `make` finds the first time.
    fn add(&self, values: [&'static str; N], n: u64, make: impl FnOnce() -> IntCounter) {
        let mut found = self.found.lock_or_recover();
        let counter = match found.iter().position(|(v, _)| *v == values) {
            Some(at) => &found[at].1,
            None => {
                found.push((values, make()));
                &found[found.len() - 1].1
            }
        };
        crate::metrics::counter::add_saturating(counter, n);
    }
}

impl StreamSeries {
    fn new(route: &str, model: &str) -> Self {
        StreamSeries {
            route: route.into(),
            model: model.into(),
            histograms: std::array::from_fn(|_| OnceLock::new()),
            stalls: std::array::from_fn(|_| OnceLock::new()),
            prompt_tokens: OnceLock::new(),
            reasoning_tokens: OnceLock::new(),
            streams: Few::default(),
            output_tokens: Few::default(),
            stream_format: Few::default(),
        }
    }

    /// The `route` label.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The `model` label.
    pub fn model(&self) -> &str {
        &self.model
    }

    fn slot(&self, slot: usize, family: &HistogramFamily, labels: &[&str]) -> &SeriesHandle {
        let handle = self.histograms[slot].get_or_init(|| family.handle(labels));
        debug_assert!(handle.is(family, labels), "a slot holds one series");
        handle
    }

    fn per_point(&self, metrics: &Metrics, which: PerPoint, point: Point) -> &SeriesHandle {
        let slot = which as usize * POINTS + point as usize;
        let p = point.as_str();
        match which {
            PerPoint::Ttft => self.slot(slot, &metrics.ttft, &[&self.route, &self.model, p]),
            PerPoint::Ttfo => self.slot(slot, &metrics.ttfo, &[&self.route, &self.model, p]),
            PerPoint::ReasoningDuration => self.slot(
                slot,
                &metrics.reasoning_duration,
                &[&self.route, &self.model, p],
            ),
            PerPoint::Ttfb => self.slot(slot, &metrics.ttfb, &[&self.route, p]),
            PerPoint::EventsPerFrame => {
                self.slot(slot, &metrics.events_per_frame, &[&self.route, p])
            }
        }
    }

    fn per_phase(
        &self,
        metrics: &Metrics,
        which: PerPhase,
        point: Point,
        phase: Phase,
    ) -> &SeriesHandle {
        let slot = PER_POINT * POINTS
            + (which as usize * POINTS + point as usize) * PHASES
            + phase.index();
        let labels = [&*self.route, &*self.model, point.as_str(), phase.as_str()];
        let family = match which {
            PerPhase::Itl => &metrics.itl,
            PerPhase::StallDuration => &metrics.stall_duration,
            PerPhase::Jank => &metrics.jank,
        };
        self.slot(slot, family, &labels)
    }

    fn per_stream(&self, metrics: &Metrics, which: PerStream) -> &SeriesHandle {
        let slot = PER_POINT * POINTS + PER_PHASE * POINTS * PHASES + which as usize;
        let (route, model) = (&*self.route, &*self.model);
        match which {
            PerStream::TokensPerEvent => {
                self.slot(slot, &metrics.tokens_per_event, &[route, model])
            }
            PerStream::Tpot => self.slot(slot, &metrics.tpot, &[route, model]),
            PerStream::RequestTokensInput => {
                self.slot(slot, &metrics.request_tokens, &[route, model, "input"])
            }
            PerStream::RequestTokensOutput => {
                self.slot(slot, &metrics.request_tokens, &[route, model, "output"])
            }
            PerStream::RequestDuration => self.slot(slot, &metrics.request_duration, &[route]),
            PerStream::ProxyDelay => self.slot(slot, &metrics.proxy_delay, &[route]),
        }
    }

    /// `metronome_time_to_first_token_seconds` at `point`.
    pub fn ttft(&self, metrics: &Metrics, point: Point) -> &SeriesHandle {
        self.per_point(metrics, PerPoint::Ttft, point)
    }

    /// `metronome_time_to_first_output_token_seconds` at `point`.
    pub fn ttfo(&self, metrics: &Metrics, point: Point) -> &SeriesHandle {
        self.per_point(metrics, PerPoint::Ttfo, point)
    }

    /// `metronome_reasoning_duration_seconds` at `point`.
    pub fn reasoning_duration(&self, metrics: &Metrics, point: Point) -> &SeriesHandle {
        self.per_point(metrics, PerPoint::ReasoningDuration, point)
    }

    /// `metronome_time_to_first_byte_seconds` at `point`.
    pub fn ttfb(&self, metrics: &Metrics, point: Point) -> &SeriesHandle {
        self.per_point(metrics, PerPoint::Ttfb, point)
    }

    /// `metronome_events_per_frame` at `point`.
    pub fn events_per_frame(&self, metrics: &Metrics, point: Point) -> &SeriesHandle {
        self.per_point(metrics, PerPoint::EventsPerFrame, point)
    }

    /// `metronome_inter_token_latency_seconds` at `point` in `phase`.
    pub fn itl(&self, metrics: &Metrics, point: Point, phase: Phase) -> &SeriesHandle {
        self.per_phase(metrics, PerPhase::Itl, point, phase)
    }

    /// `metronome_stall_duration_seconds` at `point` in `phase`.
    pub fn stall_duration(&self, metrics: &Metrics, point: Point, phase: Phase) -> &SeriesHandle {
        self.per_phase(metrics, PerPhase::StallDuration, point, phase)
    }

    /// `metronome_stream_jank_ratio` at `point` in `phase`.
    pub fn jank(&self, metrics: &Metrics, point: Point, phase: Phase) -> &SeriesHandle {
        self.per_phase(metrics, PerPhase::Jank, point, phase)
    }

    /// `metronome_tokens_per_event`.
    pub fn tokens_per_event(&self, metrics: &Metrics) -> &SeriesHandle {
        self.per_stream(metrics, PerStream::TokensPerEvent)
    }

    /// `metronome_time_per_output_token_seconds`.
    pub fn tpot(&self, metrics: &Metrics) -> &SeriesHandle {
        self.per_stream(metrics, PerStream::Tpot)
    }

    /// `metronome_request_tokens` of `type` `input` (`input`) or `output`.
    pub fn request_tokens(&self, metrics: &Metrics, input: bool) -> &SeriesHandle {
        let which = if input {
            PerStream::RequestTokensInput
        } else {
            PerStream::RequestTokensOutput
        };
        self.per_stream(metrics, which)
    }

    /// `metronome_request_duration_seconds` (per route).
    pub fn request_duration(&self, metrics: &Metrics) -> &SeriesHandle {
        self.per_stream(metrics, PerStream::RequestDuration)
    }

    /// `metronome_proxy_delay_seconds` (per route).
    pub fn proxy_delay(&self, metrics: &Metrics) -> &SeriesHandle {
        self.per_stream(metrics, PerStream::ProxyDelay)
    }

    /// `metronome_stalls_total` at `point` in `phase`.
    pub fn stalls(&self, metrics: &Metrics, point: Point, phase: Phase) -> &IntCounter {
        self.stalls[point as usize * PHASES + phase.index()].get_or_init(|| {
            metrics.stalls.with_label_values(&[
                &self.route,
                &self.model,
                point.as_str(),
                phase.as_str(),
            ])
        })
    }

    /// `metronome_prompt_tokens_total`.
    pub fn prompt_tokens(&self, metrics: &Metrics) -> &IntCounter {
        self.prompt_tokens.get_or_init(|| {
            metrics
                .prompt_tokens
                .with_label_values(&[&self.route, &self.model])
        })
    }

    /// `metronome_reasoning_tokens_total`.
    pub fn reasoning_tokens(&self, metrics: &Metrics) -> &IntCounter {
        self.reasoning_tokens.get_or_init(|| {
            metrics
                .reasoning_tokens
                .with_label_values(&[&self.route, &self.model])
        })
    }

    /// Counts a stream in `metronome_streams_total` under `outcome` and `finish`.
    pub fn count_stream(&self, metrics: &Metrics, outcome: &'static str, finish: &'static str) {
        self.streams.add([outcome, finish], 1, || {
            metrics
                .streams
                .with_label_values(&[&self.route, &self.model, outcome, finish])
        });
    }

    /// Adds `n` to `metronome_output_tokens_total` under `source`.
    pub fn add_output_tokens(&self, metrics: &Metrics, source: &'static str, n: u64) {
        self.output_tokens.add([source], n, || {
            metrics
                .output_tokens
                .with_label_values(&[&self.route, &self.model, source])
        });
    }

    /// Counts a stream in `metronome_stream_format_total{route,format}` under `format`.
    pub fn count_format(&self, metrics: &Metrics, format: &'static str) {
        self.stream_format.add([format], 1, || {
            metrics
                .stream_format
                .with_label_values(&[&self.route, format])
        });
    }
}

/// Every (route, model) pair's [`StreamSeries`], by a hash of the pair.
#[derive(Debug, Default)]
pub struct StreamSeriesMap {
    map: RwLock<LabelMap<StreamSeries>>,
}

impl StreamSeriesMap {
    /// The series of streams of `route` and the (bounded) `model` label.
    pub fn get(&self, route: &str, model: &str) -> Arc<StreamSeries> {
        find_or_make(
            &self.map,
            hash_labels(&[route, model]),
            |s| &*s.route == route && &*s.model == model,
            || StreamSeries::new(route, model),
            |_| {},
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn metrics() -> Metrics {
        let models = crate::metrics::ModelLabels::new(&[], 8);
        let buckets = crate::metrics::Buckets::default();
        Metrics::new(&buckets, models, Duration::from_millis(500)).unwrap()
    }

    #[test]
    fn one_bundle_per_pair() {
        let map = StreamSeriesMap::default();
        let a = map.get("chat", "m");
        assert!(Arc::ptr_eq(&a, &map.get("chat", "m")));
        assert!(!Arc::ptr_eq(&a, &map.get("chat", "n")));
        assert!(!Arc::ptr_eq(&a, &map.get("completions", "m")));
        assert_eq!((a.route(), a.model()), ("chat", "m"));
    }

    /// Every slot is its own series, with the labels its family's lookup would give: a slot
    /// shared by two figures, or labels in the wrong order, fails here (and in debug builds at
    /// the slot's first use).
    #[test]
    fn every_slot_is_the_series_of_its_labels() {
        let m = metrics();
        let s = StreamSeries::new("r", "m");
        let mut seen = Vec::new();
        let mut check = |handle: &SeriesHandle, family: &HistogramFamily, labels: &[&str]| {
            assert!(handle.is(family, labels), "{} {labels:?}", family.name());
            seen.push(handle.clone());
        };
        for point in [Point::Ingress, Point::Egress, Point::Client] {
            let p = point.as_str();
            check(s.ttft(&m, point), &m.ttft, &["r", "m", p]);
            check(s.ttfo(&m, point), &m.ttfo, &["r", "m", p]);
            check(
                s.reasoning_duration(&m, point),
                &m.reasoning_duration,
                &["r", "m", p],
            );
            check(s.ttfb(&m, point), &m.ttfb, &["r", p]);
            check(
                s.events_per_frame(&m, point),
                &m.events_per_frame,
                &["r", p],
            );
            for phase in Phase::ALL {
                let labels = ["r", "m", p, phase.as_str()];
                check(s.itl(&m, point, phase), &m.itl, &labels);
                check(
                    s.stall_duration(&m, point, phase),
                    &m.stall_duration,
                    &labels,
                );
                check(s.jank(&m, point, phase), &m.jank, &labels);
                s.stalls(&m, point, phase).inc();
                assert_eq!(m.stalls.with_label_values(&labels).get(), 1);
            }
        }
        check(s.tokens_per_event(&m), &m.tokens_per_event, &["r", "m"]);
        check(s.tpot(&m), &m.tpot, &["r", "m"]);
        check(
            s.request_tokens(&m, true),
            &m.request_tokens,
            &["r", "m", "input"],
        );
        check(
            s.request_tokens(&m, false),
            &m.request_tokens,
            &["r", "m", "output"],
        );
        check(s.request_duration(&m), &m.request_duration, &["r"]);
        check(s.proxy_delay(&m), &m.proxy_delay, &["r"]);
        assert_eq!(seen.len(), SLOTS);
        for _ in 0..2 {
            s.count_stream(&m, "complete", "stop");
        }
        s.count_stream(&m, "complete", "length");
        s.add_output_tokens(&m, "usage", 5);
        s.add_output_tokens(&m, "counted", 7);
        s.add_output_tokens(&m, "usage", 1);
        s.count_format(&m, "openai");
        let streams = |o, f| m.streams.with_label_values(&["r", "m", o, f]).get();
        assert_eq!(
            (streams("complete", "stop"), streams("complete", "length")),
            (2, 1)
        );
        let tokens = |source| m.output_tokens.with_label_values(&["r", "m", source]).get();
        assert_eq!((tokens("usage"), tokens("counted")), (6, 7));
        assert_eq!(m.stream_format.with_label_values(&["r", "openai"]).get(), 1);
        s.prompt_tokens(&m).inc_by(3);
        s.reasoning_tokens(&m).inc_by(2);
        assert_eq!(m.prompt_tokens.with_label_values(&["r", "m"]).get(), 3);
        assert_eq!(m.reasoning_tokens.with_label_values(&["r", "m"]).get(), 2);
    }

    /// A sample counted through a slot is the family's, as if counted by its label values; a
    /// series is made on its slot's first use, not before.
    #[test]
    fn a_slot_counts_into_its_family() {
        let m = metrics();
        let s = m.stream_series.get("r", "m");
        assert!(m.ttft.snapshot(false).is_empty());
        s.ttft(&m, Point::Egress).observe(0.25);
        m.ttft.observe(&["r", "m", "egress"], 0.5);
        let snapshot = m.ttft.snapshot(false);
        assert_eq!(snapshot.len(), 1);
        assert_eq!((snapshot[0].count, snapshot[0].sum), (2, 0.75));
    }
}
