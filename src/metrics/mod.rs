//! The Prometheus metric contract of docs/metrics.md.
//!
//! Names, labels, help texts and default buckets are a public interface: dashboards and alerts are
//! written against them, so they change only with docs/metrics.md, as a breaking change. Stream
//! figures are merged here once per stream by the ledger; request figures once per request by the
//! forwarder.

pub mod counter;
pub mod exposition;
pub mod histogram;
pub mod models;
pub mod native;
mod native_bounds;
mod numbers;
mod openmetrics;
pub mod proto;
mod proto_wire;
#[doc(hidden)]
pub mod reference;
pub mod stream_series;
mod text;

use crate::poison::RwLockExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::Deserialize;

use crate::format::FinishReason;
use crate::sketch::GapHistogramIndex;

pub use counter::{CounterExemplar, CounterExemplars, CounterFamily};
pub use histogram::{
    BucketCounts, Exemplar, ExemplarPolicy, FamilyOptions, HistogramFamily, LocalHistogram,
    SeriesHandle, SeriesSnapshot, StoredExemplar, MAX_BOUNDS,
};
pub use models::ModelLabels;
pub use native::{NativeCounts, NativeIndex, NativeSettings};
pub use stream_series::{StreamSeries, StreamSeriesMap};

/// Where a figure was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// When a frame's bytes were read from the upstream connection.
    Ingress,
    /// When a frame's bytes were written to the client connection's socket.
    Egress,
    /// When an event arrived at the client (probe or browser beacon).
    Client,
}

// === impl Point ===

impl Point {
    /// The `point` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Point::Ingress => "ingress",
            Point::Egress => "egress",
            Point::Client => "client",
        }
    }
}

/// How a stream ended: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream ended the stream and every byte was handed to the client.
    Complete,
    /// The client went away before the stream ended.
    ClientCancelled,
    /// The upstream failed: connection reset, malformed HTTP, or an error event mid-stream.
    UpstreamError,
    /// The upstream went silent for longer than the idle timeout.
    UpstreamTimeout,
    /// The stream ended without a single token event.
    NoToken,
}

// === impl Outcome ===

impl Outcome {
    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ClientCancelled => "client_cancelled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::NoToken => "no_token",
        }
    }

    /// The `finish_reason` label of a stream that ended this way and whose body said `said`:
    /// the proxy's own view wins where it knows better (a client that went away is `abort`, an
    /// upstream that failed or went silent is `error`, whatever the body said before), so the
    /// label stays bounded and agrees with `outcome`.
    pub fn finish_label(self, said: Option<FinishReason>) -> &'static str {
        match self {
            Outcome::ClientCancelled => FinishReason::Abort.label(),
            Outcome::UpstreamError | Outcome::UpstreamTimeout => FinishReason::Error.label(),
            Outcome::Complete | Outcome::NoToken => FinishReason::label_of(said),
        }
    }
}

/// Bucket upper bounds of every histogram, in seconds (ratios and counts for the last three).
/// The defaults keep every vLLM and OpenTelemetry boundary, so `le` selectors compare.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Buckets {
    /// Time to first token and first byte, and request duration.
    pub ttft: Vec<f64>,
    /// Inter-token latency and time per output token.
    pub itl: Vec<f64>,
    /// Proxy delay (egress minus ingress) per frame.
    pub proxy_delay: Vec<f64>,
    /// Length of each stall.
    pub stall_duration: Vec<f64>,
    /// Per-stream jank ratio (p99 gap / p50 gap).
    pub jank_ratio: Vec<f64>,
    /// Tokens per token event.
    pub tokens_per_event: Vec<f64>,
    /// Events per frame.
    pub events_per_frame: Vec<f64>,
}

impl Default for Buckets {
    fn default() -> Self {
        let counts = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];
        Buckets {
            ttft: vec![
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
            ],
            itl: vec![
                0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
            ],
            proxy_delay: vec![
                0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ],
            stall_duration: vec![
                0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
            ],
            jank_ratio: vec![
                1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 50.0, 100.0,
            ],
            tokens_per_event: counts.clone(),
            events_per_frame: counts,
        }
    }
}

/// `[metrics]`: how the histograms are published.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `metrics.flush_interval`, as written: how often a running stream's counts are merged into
    /// what `/metrics` serves (default `1s`; `0s`: only when the stream ends). Validated into
    /// `Config::flush_interval`.
    pub flush_interval: String,
    /// `[metrics.native]`: native histograms beside the classic buckets.
    pub native: NativeConfig,
    /// `metrics.classic`: `default` (today's buckets, vLLM- and OpenTelemetry-compatible) or
    /// `fine` (up to 32 bounds per latency histogram, for backends that cannot read native
    /// histograms). A `[buckets]` list that differs from the default is kept either way.
    pub classic: ClassicPreset,
    /// `metrics.names`: `metronome`, `otel` or `both`; see `otlp::names`.
    pub names: Names,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            flush_interval: "1s".into(),
            native: NativeConfig::default(),
            classic: ClassicPreset::default(),
            names: Names::default(),
        }
    }
}

/// `metrics.names`: which names the histograms with a GenAI semconv meaning are published under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Names {
    /// metronome's own names only (the default): the contract of docs/metrics.md.
    #[default]
    Metronome,
    /// On OTLP the semconv names (`gen_ai.server.time_to_first_token`, ...) and `metronome.` for
    /// the rest; on /metrics the semconv histograms' Prometheus translation beside the contract.
    Otel,
    /// Both names on OTLP; on /metrics the same as `otel`.
    Both,
}

/// The classic buckets' preset (`metrics.classic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClassicPreset {
    /// Today's buckets: every vLLM and OpenTelemetry boundary.
    #[default]
    Default,
    /// Finer buckets where LLM latencies fall (ratios of 1.25 to 1.5 from 1 ms to 1 s for the
    /// gaps): for VictoriaMetrics and other backends without native histograms.
    Fine,
}

/// `[metrics.native]`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NativeConfig {
    /// Keep native histograms (default true); the protobuf exposition carries them.
    pub enabled: bool,
    /// Buckets 2^(2^-schema) apart: -4 to 8 (default 4: 2^(1/16), about 2.2 % quantile error).
    pub schema: i8,
    /// Samples at most this (seconds, or a ratio) are counted in the zero bucket (default 2^-128,
    /// Prometheus's).
    pub zero_threshold: f64,
    /// Past this many buckets a series halves its resolution (default 160).
    pub max_buckets: usize,
}

impl Default for NativeConfig {
    fn default() -> Self {
        let settings = NativeSettings::default();
        NativeConfig {
            enabled: true,
            schema: settings.schema,
            zero_threshold: settings.zero_threshold,
            max_buckets: settings.max_buckets,
        }
    }
}

// === impl NativeConfig ===

impl NativeConfig {
    /// The settings of a family's native buckets; `None` when they are off.
    pub fn settings(&self) -> Option<NativeSettings> {
        self.enabled.then_some(NativeSettings {
            schema: self.schema,
            zero_threshold: self.zero_threshold,
            max_buckets: self.max_buckets,
        })
    }

    /// What is wrong with these settings, as `(key, reason)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(native::MIN_SCHEMA..=native::MAX_SCHEMA).contains(&self.schema) {
            problems.push((
                "metrics.native.schema",
                format!("{} is out of range (-4 to 8)", self.schema),
            ));
        }
        if !(self.zero_threshold.is_finite() && self.zero_threshold >= 0.0) {
            problems.push((
                "metrics.native.zero_threshold",
                format!("{} must be finite and not negative", self.zero_threshold),
            ));
        }
        if !(1..=32_768).contains(&self.max_buckets) {
            problems.push((
                "metrics.native.max_buckets",
                format!("{} is out of range (1 to 32768)", self.max_buckets),
            ));
        }
        problems
    }
}

// === impl Buckets (presets) ===

impl Buckets {
    /// The finer classic preset: at most [`MAX_BOUNDS`] bounds per latency histogram, dense where
    /// LLM latencies fall; the counts' buckets and the jank ratio's stay.
    pub fn fine() -> Self {
        Buckets {
            ttft: vec![
                0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4,
                0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0,
                40.0, 80.0, 160.0,
            ],
            itl: vec![
                0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.006, 0.0075, 0.01, 0.0125,
                0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25,
                0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
            ],
            proxy_delay: vec![
                0.00001, 0.000015, 0.00002, 0.000025, 0.00003, 0.00004, 0.00005, 0.000075, 0.0001,
                0.00015, 0.0002, 0.00025, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002,
                0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ],
            stall_duration: vec![
                0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5,
                10.0, 15.0, 20.0, 30.0, 60.0,
            ],
            ..Buckets::default()
        }
    }

    /// These buckets with `preset` applied: each list left at its default takes the preset's.
    pub fn with_preset(mut self, preset: ClassicPreset) -> Self {
        if preset == ClassicPreset::Default {
            return self;
        }
        let (default, fine) = (Buckets::default(), Buckets::fine());
        for (list, default, fine) in [
            (&mut self.ttft, default.ttft, fine.ttft),
            (&mut self.itl, default.itl, fine.itl),
            (&mut self.proxy_delay, default.proxy_delay, fine.proxy_delay),
            (
                &mut self.stall_duration,
                default.stall_duration,
                fine.stall_duration,
            ),
        ] {
            if *list == default {
                *list = fine;
            }
        }
        self
    }
}

/// The trace ID of a W3C `traceparent` (`version-traceid-parentid-flags`) that
/// `trace_context::TraceParent::parse` accepts, as its 32 lowercase hex digits; `None` for
/// anything else, so an exemplar names exactly the traces a span continues.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    crate::trace_context::TraceParent::parse(traceparent)?;
    traceparent.trim_matches([' ', '\t']).get(3..35)
}

/// Every metric metronome exports, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    /// The registry `/metrics` encodes.
    pub registry: Registry,
    /// `metronome_time_to_first_token_seconds{route,model,point}`.
    pub ttft: HistogramFamily,
    /// `metronome_time_to_first_byte_seconds{route,point}`.
    pub ttfb: HistogramFamily,
    /// `metronome_time_to_first_output_token_seconds{route,model,point}`: TTFO, to the first
    /// token event that is not reasoning.
    pub ttfo: HistogramFamily,
    /// `metronome_reasoning_duration_seconds{route,model,point}`: first to last reasoning token
    /// event, one sample per stream that reasoned.
    pub reasoning_duration: HistogramFamily,
    /// `metronome_inter_token_latency_seconds{route,model,point,phase}`, one sample per token
    /// event, in the phase of the event that ends the gap.
    pub itl: HistogramFamily,
    /// The inter-token latency histogram's bucket for a gap, from the gap's bucket in the
    /// stream's gap sketch: a gap is counted in both, per token event, at two points.
    pub itl_index: GapHistogramIndex,
    /// `metronome_time_per_output_token_seconds{route,model}`, one sample per stream.
    pub tpot: HistogramFamily,
    /// `metronome_stream_jank_ratio{route,model,point,phase}`, one sample per stream and phase
    /// with 8 gaps or more.
    pub jank: HistogramFamily,
    /// `metronome_stalls_total{route,model,point,phase}`.
    pub stalls: IntCounterVec,
    /// `metronome_stall_duration_seconds{route,model,point,phase}`.
    pub stall_duration: HistogramFamily,
    /// `metronome_proxy_delay_seconds{route}`, per frame.
    pub proxy_delay: HistogramFamily,
    /// The proxy delay histogram's bucket for a delay, without a search of its bounds (per
    /// frame).
    pub proxy_delay_index: GapHistogramIndex,
    /// `metronome_tokens_per_event{route,model}`.
    pub tokens_per_event: HistogramFamily,
    /// `metronome_events_per_frame{route,point}`.
    pub events_per_frame: HistogramFamily,
    /// `metronome_output_tokens_total{route,model,source}`.
    pub output_tokens: IntCounterVec,
    /// `metronome_prompt_tokens_total{route,model}`: input tokens of finished streams and
    /// non-streaming answers, as the server's usage reported them.
    pub prompt_tokens: IntCounterVec,
    /// `metronome_reasoning_tokens_total{route,model}`: reasoning tokens of finished streams and
    /// non-streaming answers, as the server's usage reported them.
    pub reasoning_tokens: IntCounterVec,
    /// `metronome_batch_episode_duration_seconds{upstream}` (docs/batch.md); its exemplar names the
    /// episode's last arrival, most often the request that caused it.
    pub batch_episode_duration: HistogramFamily,
    /// `metronome_batch_episode_streams{upstream}`: streams caught in each episode.
    pub batch_episode_streams: HistogramFamily,
    /// `metronome_batch_episode_arrivals{upstream}`: requests in each episode's lookback.
    pub batch_episode_arrivals: HistogramFamily,
    /// `metronome_streams_total{route,model,outcome,finish_reason}`; `finish_reason` is one of
    /// [`FinishReason`](crate::format::FinishReason)'s labels or `none`.
    pub streams: IntCounterVec,
    /// `metronome_request_tokens{route,model,type}`: per stream, its input (prompt) tokens as
    /// the server reported them and its output tokens, `type` = `input` | `output`; the shape of
    /// OpenTelemetry's `gen_ai.client.token.usage`.
    pub request_tokens: HistogramFamily,
    /// `metronome_slo_streams_total{route,model,objective,result}`: streams whose request set
    /// latency objectives (`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`), met or missed.
    pub slo_streams: IntCounterVec,
    /// `metronome_streams_active{route}`.
    pub streams_active: IntGaugeVec,
    /// `metronome_requests_total{route,status_class}`.
    pub requests: IntCounterVec,
    /// `metronome_request_duration_seconds{route}`.
    pub request_duration: HistogramFamily,
    /// `metronome_upstream_errors_total{route,kind}`.
    pub upstream_errors: IntCounterVec,
    /// `metronome_unparsed_events_total{route,reason}`: events the accountant could not inspect
    /// (they still went through untouched).
    pub unparsed_events: IntCounterVec,
    /// `metronome_config_reload_failures_total`: SIGHUP reloads refused because the file was
    /// invalid (the running configuration stayed), so a reload that did nothing shows.
    pub config_reload_failures: IntCounter,
    /// `metronome_sniff_timeouts_total`: plain-TCP connections closed because their first bytes
    /// did not tell HTTP/1 from HTTP/2 within `timeouts.sniff`, so a client that sends one byte
    /// and waits shows rather than hides.
    pub sniff_timeouts: IntCounter,
    /// `metronome_beacons_total{result}`: browser beacons by how they were answered.
    pub beacons: IntCounterVec,
    /// `metronome_stream_format_total{route,format}`: metered streams by the API detected (or
    /// configured) for them, `unknown` included, so an operator can see streams whose events are
    /// only approximately accounted; a counter rather than a label on the latency histograms,
    /// which would multiply their series.
    pub stream_format: IntCounterVec,
    /// The bounded `model` label.
    pub models: ModelLabels,
    /// The series of each (route, model) pair's streams, found once per pair.
    pub stream_series: StreamSeriesMap,
    /// A gap longer than this is a stall, in nanoseconds: an atomic because a SIGHUP reload may
    /// change it while streams run; read with [`Metrics::stall_threshold`].
    stall_threshold_nanos: AtomicU64,
    /// Every histogram family, for the encoders that carry native buckets and exemplars.
    pub histograms: Vec<HistogramFamily>,
    /// The counter families with exemplars, registered after the rest
    /// ([`Metrics::register_counter`]), for the same encoders.
    counters: std::sync::RwLock<Vec<CounterFamily>>,
    /// The size of the last exposition in each format (by `Format as usize`), to size the next
    /// one's buffer at once.
    exposition_sizes: [std::sync::atomic::AtomicUsize; 3],
}

const RMP: &[&str] = &["route", "model", "point"];

/// The labels of the per-gap families: a gap is in the phase of the token event that ends it.
const RMPP: &[&str] = &["route", "model", "point", "phase"];

/// Bounds of `metronome_batch_episode_duration_seconds`: from one hitch's floor (20 ms) to a
/// prefill of half a minute.
const EPISODE_SECONDS: [f64; 10] = [0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// Bounds of the episode counts (streams caught, arrivals): powers of two to 1,024.
const EPISODE_COUNTS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Bounds of `metronome_request_tokens`: powers of 4 from 1 to 67,108,864, the bucket advice of
/// the GenAI semantic conventions for `gen_ai.client.token.usage`.
pub const TOKEN_COUNTS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

// === impl Metrics ===

impl Metrics {
    /// Creates and registers every metric, with native histograms at their defaults.
    pub fn new(
        buckets: &Buckets,
        models: ModelLabels,
        stall_threshold: Duration,
    ) -> prometheus::Result<Self> {
        Self::with_native(buckets, models, stall_threshold, &NativeConfig::default())
    }

    /// Creates and registers every metric; the latency histograms and the jank ratio get native
    /// buckets as `native` says, and ITL, TTFT, stall duration and proxy delay keep exemplars.
    //
    // Longer than 150 lines on purpose: one declaration per family (name, help text, labels,
    // buckets), the public contract of docs/metrics.md read in one place; split, a family's
    // name and the field that holds it would sit in different functions.
    pub fn with_native(
        buckets: &Buckets,
        models: ModelLabels,
        stall_threshold: Duration,
        native: &NativeConfig,
    ) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let families = std::cell::RefCell::new(Vec::new());
        let latency = |exemplars: ExemplarPolicy| FamilyOptions {
            native: native.settings(),
            exemplars,
        };
        let rich =
            |name: &str, help: &str, labels: &[&str], bounds: &[f64], options: FamilyOptions| {
                let family = HistogramFamily::with_options(name, help, labels, bounds, options)?;
                registry.register(family.reservation())?;
                families.borrow_mut().push(family.clone());
                Ok::<_, prometheus::Error>(family)
            };
        let hist = |name: &str, help: &str, labels: &[&str], bounds: &[f64]| {
            rich(name, help, labels, bounds, FamilyOptions::default())
        };
        let plain = latency(ExemplarPolicy::None);
        let with_latest = latency(ExemplarPolicy::Latest);
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let vec = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(vec.clone()))?;
            Ok::<_, prometheus::Error>(vec)
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let vec = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(vec.clone()))?;
            Ok::<_, prometheus::Error>(vec)
        };
        let itl = rich(
            "metronome_inter_token_latency_seconds",
            "Gap between consecutive token events, per event (one sample per token event after the first; events in one frame have a gap of 0), in the phase (reasoning, content, tool_call) of the event that ends it; summed over phase, every gap.",
            RMPP,
            &buckets.itl,
            with_latest,
        )?;
        let proxy_delay = rich(
            "metronome_proxy_delay_seconds",
            "Per frame: time from reading it from the upstream to writing it to the client socket.",
            &["route"],
            &buckets.proxy_delay,
            with_latest,
        )?;
        let metrics = Metrics {
            ttft: rich(
                "metronome_time_to_first_token_seconds",
                "Time from the request reaching metronome to the first token event, at each point.",
                RMP,
                &buckets.ttft,
                with_latest,
            )?,
            ttfo: rich(
                "metronome_time_to_first_output_token_seconds",
                "Time from the request reaching metronome to the first token event that is not reasoning (TTFO), at each point.",
                RMP,
                &buckets.ttft,
                with_latest,
            )?,
            reasoning_duration: rich(
                "metronome_reasoning_duration_seconds",
                "Per stream that reasoned: first to last reasoning token event, at each point.",
                RMP,
                &buckets.ttft,
                with_latest,
            )?,
            ttfb: rich(
                "metronome_time_to_first_byte_seconds",
                "Time from the request reaching metronome to the first response body byte, at each point.",
                &["route", "point"],
                &buckets.ttft,
                plain,
            )?,
            itl_index: GapHistogramIndex::new(itl.bounds()),
            itl,
            tpot: rich(
                "metronome_time_per_output_token_seconds",
                "Per stream: (last token event - first token event) / (output tokens - 1), at ingress.",
                &["route", "model"],
                &buckets.itl,
                plain,
            )?,
            jank: rich(
                "metronome_stream_jank_ratio",
                "Per stream and phase with at least 8 gaps: p99 gap / max(p50 gap, 1ms).",
                RMPP,
                &buckets.jank_ratio,
                plain,
            )?,
            stalls: counter(
                "metronome_stalls_total",
                "Inter-token gaps longer than the stall threshold, in the phase of the event that ends them.",
                RMPP,
            )?,
            stall_duration: rich(
                "metronome_stall_duration_seconds",
                "Length of each inter-token gap longer than the stall threshold, in the phase of the event that ends it.",
                RMPP,
                &buckets.stall_duration,
                latency(ExemplarPolicy::LargestSinceScrape),
            )?,
            proxy_delay_index: GapHistogramIndex::new(proxy_delay.bounds()),
            proxy_delay,
            tokens_per_event: hist(
                "metronome_tokens_per_event",
                "Tokens carried by each token event (exact where the format says so, else 1).",
                &["route", "model"],
                &buckets.tokens_per_event,
            )?,
            events_per_frame: hist(
                "metronome_events_per_frame",
                "Events completed per frame read from the upstream (ingress) or per socket write (egress).",
                &["route", "point"],
                &buckets.events_per_frame,
            )?,
            output_tokens: counter(
                "metronome_output_tokens_total",
                "Output tokens of finished streams and non-streaming answers; source=usage when the server reported them, counted otherwise.",
                &["route", "model", "source"],
            )?,
            prompt_tokens: counter(
                "metronome_prompt_tokens_total",
                "Prompt (input) tokens of finished streams and non-streaming answers, as the server's usage reported them (those that report none add nothing).",
                &["route", "model"],
            )?,
            reasoning_tokens: counter(
                "metronome_reasoning_tokens_total",
                "Reasoning tokens of finished streams and non-streaming answers, as the server's usage reported them (completion_tokens_details.reasoning_tokens, output_tokens_details.reasoning_tokens, thoughtsTokenCount).",
                &["route", "model"],
            )?,
            batch_episode_duration: rich(
                "metronome_batch_episode_duration_seconds",
                "How long each batch episode lasted (docs/batch.md); the exemplar names its last arrival.",
                &["upstream"],
                &EPISODE_SECONDS,
                with_latest,
            )?,
            batch_episode_streams: rich(
                "metronome_batch_episode_streams",
                "Streams caught in each batch episode.",
                &["upstream"],
                &EPISODE_COUNTS,
                with_latest,
            )?,
            batch_episode_arrivals: rich(
                "metronome_batch_episode_arrivals",
                "Requests the upstream received within batch.lookback before each episode began.",
                &["upstream"],
                &EPISODE_COUNTS,
                with_latest,
            )?,
            streams: counter(
                "metronome_streams_total",
                "Metered streams by how they ended: outcome as the proxy saw it, finish_reason as the server said (stop, length, tool_calls, content_filter, abort, error, other, none); a client that went away is abort and an upstream failure error, whatever the body said.",
                &["route", "model", "outcome", "finish_reason"],
            )?,
            request_tokens: rich(
                "metronome_request_tokens",
                "Per stream: input (prompt) tokens as the server's usage reported them, and output tokens (usage, else counted), by type.",
                &["route", "model", "type"],
                &TOKEN_COUNTS,
                plain,
            )?,
            slo_streams: counter(
                "metronome_slo_streams_total",
                "Streams whose request carried latency objectives (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms), by objective (ttft, tpot, all) and whether the client's stream met it.",
                &["route", "model", "objective", "result"],
            )?,
            streams_active: gauge(
                "metronome_streams_active",
                "Metered streams open now.",
                &["route"],
            )?,
            requests: counter(
                "metronome_requests_total",
                "Every proxied request, streaming or not, by response status class.",
                &["route", "status_class"],
            )?,
            request_duration: rich(
                "metronome_request_duration_seconds",
                "Every proxied request: from receipt to the end of its response body.",
                &["route"],
                &buckets.ttft,
                plain,
            )?,
            upstream_errors: counter(
                "metronome_upstream_errors_total",
                "Upstream failures by kind: connect, timeout, reset, protocol.",
                &["route", "kind"],
            )?,
            unparsed_events: counter(
                "metronome_unparsed_events_total",
                "Events forwarded untouched that the token accountant could not inspect or believe, by reason (invalid, oversize; usage_over_bound: a usage figure above 100,000,000 tokens per stream; usage_decreased: a usage figure below one the stream reported before).",
                &["route", "reason"],
            )?,
            config_reload_failures: {
                let c = IntCounter::new(
                    "metronome_config_reload_failures_total",
                    "SIGHUP reloads refused because the configuration file was invalid; the running configuration stayed.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            sniff_timeouts: {
                let c = IntCounter::new(
                    "metronome_sniff_timeouts_total",
                    "Plain-TCP client connections closed because their first bytes did not tell HTTP/1 from HTTP/2 within timeouts.sniff.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            beacons: counter(
                "metronome_beacons_total",
                "Browser beacons by result: accepted, unknown_stream, duplicate, malformed, too_large, overloaded, no_key, wrong_key, unfinished, too_many_gaps, too_long.",
                &["result"],
            )?,
            stream_format: counter(
                "metronome_stream_format_total",
                "Metered streams by the streaming API detected or configured for them (format=unknown: not recognised, every event counted as a token event).",
                &["route", "format"],
            )?,
            models,
            stream_series: StreamSeriesMap::default(),
            stall_threshold_nanos: AtomicU64::new(nanos(stall_threshold)),
            registry: registry.clone(),
            histograms: Vec::new(),
            counters: std::sync::RwLock::new(Vec::new()),
            exposition_sizes: Default::default(),
        };
        let metrics = Metrics {
            histograms: families.into_inner(),
            ..metrics
        };
        let build_info = gauge(
            "metronome_build_info",
            "Always 1; the version label says which build is running.",
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        Ok(metrics)
    }

    /// A gap longer than this is a stall.
    #[inline]
    pub fn stall_threshold(&self) -> Duration {
        Duration::from_nanos(self.stall_threshold_nanos.load(Ordering::Relaxed))
    }

    /// The stall threshold in nanoseconds, to compare a gap's without making a `Duration`.
    #[inline]
    pub fn stall_threshold_nanos(&self) -> u64 {
        self.stall_threshold_nanos.load(Ordering::Relaxed)
    }

    /// Changes the stall threshold (a reload): gaps measured from now on are compared with it.
    pub fn set_stall_threshold(&self, threshold: Duration) {
        self.stall_threshold_nanos
            .store(nanos(threshold), Ordering::Relaxed);
    }

    /// Adds a collector of the embedding program's own to the exposition (a program that runs the
    /// proxy as a library, or a test that makes scrapes slow).
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> prometheus::Result<()> {
        self.registry.register(collector)
    }

    /// Registers a counter family with exemplars: its counters go into the registry as plain
    /// ones (the text format 0.0.4 shows them as before), and the OpenMetrics and protobuf
    /// encoders add each series' exemplar.
    pub fn register_counter(&self, family: &CounterFamily) -> prometheus::Result<()> {
        self.registry.register(family.collector())?;
        self.counters.write_or_recover().push(family.clone());
        Ok(())
    }

    /// The counter family with exemplars named `name`, if one is registered.
    pub(crate) fn counter_family(&self, name: &str) -> Option<CounterFamily> {
        self.counters
            .read_or_recover()
            .iter()
            .find(|c| c.name() == name)
            .cloned()
    }
}

/// The content type of the Prometheus text exposition format (0.0.4).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The `status_class` label of an HTTP status: `1xx` … `5xx`.
pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}
