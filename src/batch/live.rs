//! The detector wired to the proxy: one [`EpisodeTracker`] per upstream, a [`StreamProbe`] per
//! metered stream, a sweep task per upstream while it has work, and the metrics.
//!
//! Per frame a probe does only stream-local work: the hitch rule and a relaxed store of the last
//! token time into its own [`Beat`]. The upstream's lock is taken when a stream starts, when it
//! ends, when a hitch ends (rare) and at each sweep; never per frame.

use crate::poison::LockExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::hitch::{HitchLimits, HitchRule};
use super::tracker::{Beat, Episode, EpisodeTracker, Settled, SweepOutcome};
use super::BatchSettings;
use crate::config::Upstream;
use crate::format::{Phase, PhaseMix};
use crate::metering::clock::Tick;
use crate::metrics::{CounterExemplar, CounterFamily, Exemplar, Metrics};

/// The `upstream` label of the top-level `server.upstream` (`--upstream`).
pub const DEFAULT_UPSTREAM: &str = "default";

/// What a hitch carries until its scope is known: its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitchLabels {
    /// The stream's route label.
    pub route: Arc<str>,
    /// The stream's bounded model label, when known by then.
    pub model: Option<Arc<str>>,
    /// The stream's ID.
    pub stream: Arc<str>,
    /// The trace ID of the stream's `traceparent`, when it had one (for the exemplar).
    pub trace_id: Option<Arc<str>>,
    /// When the stream was received (nanoseconds since the clock's origin).
    pub received: i64,
    /// The index (from 0) of the token event that ended the gap.
    pub event: u64,
    /// The phase of that token event: the gap's phase.
    pub phase: Phase,
}

/// A hitch of one stream with its scope, as `/streams/{id}` marks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitchMark {
    /// The index (from 0) of the token event that ended the gap.
    pub event: u64,
    /// The phase of that token event: the gap's phase.
    pub phase: Phase,
    /// Where the gap began, in microseconds from the stream's receipt.
    pub from_us: u64,
    /// Where it ended.
    pub to_us: u64,
    /// Its scope.
    pub scope: super::Scope,
    /// The episode it overlaps (with `upstream`), when batch.
    pub episode: Option<u64>,
    /// The upstream's label.
    pub upstream: Arc<str>,
}

/// Hitch marks kept for `/streams/{id}`, over all streams (oldest dropped first).
pub const MAX_MARKS: usize = 8192;

/// The tracker of one upstream and whether its sweep task runs.
#[derive(Debug)]
pub struct UpstreamEpisodes {
    /// The `upstream` label.
    pub name: Arc<str>,
    /// Which configured upstream this is.
    upstream: Upstream,
    inner: Mutex<Inner>,
    /// Wakes the sweep early: a stream's first token came or a stream reported a hitch.
    wake: tokio::sync::Notify,
    /// The sweep interval, in nanoseconds (the tracker's, and the sweep task's).
    every: i64,
}

#[derive(Debug)]
struct Inner {
    tracker: EpisodeTracker<HitchLabels>,
    sweeping: bool,
    /// When the sweep runs next (nanoseconds, as [`raw`] reads a tick): `i64::MIN` when it is
    /// about to (just spawned), `i64::MAX` while it lingers with nothing to watch. A first token
    /// wakes it only when that is more than an interval away.
    next_sweep: i64,
    /// When a stream last ended (as [`raw`] reads a tick): the sweep lingers until
    /// [`SWEEP_LINGER`] after it.
    last_end: i64,
}

// === impl Inner ===

impl Inner {
    /// How much longer, at `now`, the sweep lingers after the last stream's end.
    fn linger_left(&self, now: i64) -> std::time::Duration {
        let until = self.last_end.saturating_add(nanos(SWEEP_LINGER));
        std::time::Duration::from_nanos(u64::try_from(until.saturating_sub(now)).unwrap_or(0))
    }
}

/// The counters of batch hitches and episodes (registered into the proxy's registry; the
/// episode histograms are the proxy's own families, for their native buckets and exemplars).
/// Each series carries an exemplar in OpenMetrics and protobuf (docs/batch.md).
#[derive(Debug, Clone)]
pub struct BatchMetrics {
    /// `metronome_hitches_total{route,model,scope}`; the exemplar names the stream of the
    /// longest hitch since the last scrape.
    pub hitches: CounterFamily,
    /// `metronome_batch_episodes_total{upstream}`; the exemplar names the first stream caught in
    /// the longest episode since the last scrape.
    pub episodes: CounterFamily,
}

// === impl BatchMetrics ===

impl BatchMetrics {
    /// Creates the counters and registers them with `metrics`.
    pub fn register(metrics: &Metrics) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let family = CounterFamily::new(name, help, labels)?;
            metrics.register_counter(&family)?;
            Ok::<_, prometheus::Error>(family)
        };
        Ok(BatchMetrics {
            hitches: counter(
                "metronome_hitches_total",
                "Token-event gaps at ingress that were hitches, by scope: batch (overlapping an episode of the upstream) or stream.",
                &["route", "model", "scope"],
            )?,
            episodes: counter(
                "metronome_batch_episodes_total",
                "Episodes: stretches during which at least batch.min_streams and batch.min_share of an upstream's streams were inside a hitch at once.",
                &["upstream"],
            )?,
        })
    }
}

/// Every upstream's tracker, and what a stream needs to join one.
#[derive(Debug)]
pub struct BatchDetector {
    settings: BatchSettings,
    metrics: Arc<Metrics>,
    batch_metrics: BatchMetrics,
    /// The top-level upstream, labelled `default`.
    default_upstream: Upstream,
    /// One per configured upstream that has had a stream (bounded by the configuration).
    upstreams: Mutex<Vec<Arc<UpstreamEpisodes>>>,
    next_key: AtomicU64,
    /// The latest settled hitches, by stream ID, bounded by [`MAX_MARKS`].
    marks: Mutex<std::collections::VecDeque<(Arc<str>, HitchMark)>>,
}

// === impl BatchDetector ===

impl BatchDetector {
    /// A detector with `settings` whose metrics go into `metrics`; `default_upstream` is the
    /// top-level upstream (labelled `default`; the others by their `host:port`).
    pub fn new(
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        default_upstream: &Upstream,
    ) -> prometheus::Result<Arc<Self>> {
        let batch_metrics = BatchMetrics::register(&metrics)?;
        Ok(Arc::new(BatchDetector {
            settings,
            metrics,
            batch_metrics,
            default_upstream: default_upstream.clone(),
            upstreams: Mutex::new(Vec::new()),
            next_key: AtomicU64::new(1),
            marks: Mutex::new(std::collections::VecDeque::new()),
        }))
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &BatchSettings {
        &self.settings
    }

    /// The tracker of `upstream`, made on its first stream.
    /// Found by comparing the upstreams' parts (on every stream's start), not their URLs' text.
    fn upstream(&self, upstream: &Upstream) -> Arc<UpstreamEpisodes> {
        let mut all = self.upstreams.lock_or_recover();
        if let Some(found) = all.iter().find(|u| u.upstream == *upstream) {
            return found.clone();
        }
        let name: Arc<str> = if *upstream == self.default_upstream {
            Arc::from(DEFAULT_UPSTREAM)
        } else {
            Arc::from(upstream.authority.as_str())
        };
        let sweep = nanos(self.settings.sweep_interval());
        let made = Arc::new(UpstreamEpisodes {
            name,
            upstream: upstream.clone(),
            inner: Mutex::new(Inner {
                tracker: EpisodeTracker::new(self.settings, sweep),
                sweeping: false,
                next_sweep: i64::MIN,
                last_end: 0,
            }),
            wake: tokio::sync::Notify::new(),
            every: sweep,
        });
        all.push(made.clone());
        made
    }

    /// A stream to `upstream` began (received at `received`): its probe, or `None` when the
    /// detector is off. Starts the upstream's sweep if it was not running. `trace_id` is the
    /// trace of its request's `traceparent`, for the exemplars that name the stream.
    pub fn open(
        self: &Arc<Self>,
        upstream: &Upstream,
        id: Arc<str>,
        trace_id: Option<&str>,
        route: Arc<str>,
        received: Tick,
        body_bytes: Option<u64>,
    ) -> Option<StreamProbe> {
        if !self.settings.enabled {
            return None;
        }
        let episodes = self.upstream(upstream);
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let trace_id: Option<Arc<str>> = trace_id.map(Arc::from);
        let beat = Arc::new(Beat::default());
        let start = {
            let mut inner = episodes.lock();
            inner.tracker.start(
                key,
                id.clone(),
                trace_id.clone(),
                raw(received),
                body_bytes,
                beat.clone(),
            );
            let start = !std::mem::replace(&mut inner.sweeping, true);
            if start {
                inner.next_sweep = i64::MIN;
            }
            start
        };
        // A running sweep is not woken, lingering or not: a stream gives it nothing to do before
        // its first token, which wakes it (after that token's write). Woken here, a lingering
        // sweep ran between the stream's first write and its first token, on the token's path
        // when the token came right behind the head (the board's mock, most engines' role
        // chunk); and a wake-up per stream cost a sweep each.
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(sweep(self.clone(), episodes.clone()));
                }
                Err(_) => episodes.lock().sweeping = false,
            }
        }
        let stall_nanos = i64::try_from(self.metrics.stall_threshold_nanos()).unwrap_or(i64::MAX);
        Some(StreamProbe {
            upstream: episodes,
            key,
            rule: HitchRule::new(HitchLimits {
                stall_nanos,
                gap_ratio: self.settings.gap_ratio,
                min_gap_nanos: self.settings.min_gap_nanos(),
            }),
            beat,
            last_token: None,
            labels: HitchLabels {
                route,
                model: None,
                stream: id,
                trace_id,
                received: raw(received),
                event: 0,
                phase: Phase::Content,
            },
            events: 0,
            prompt_tokens: None,
            detector: self.clone(),
        })
    }

    /// Every upstream's episodes (the open one and those remembered), newest first per upstream;
    /// each with its upstream's name.
    pub fn episodes(&self) -> Vec<(Arc<str>, Episode)> {
        let all = self.upstreams.lock_or_recover().clone();
        let mut out = Vec::new();
        for upstream in all {
            let inner = upstream.lock();
            out.extend(
                inner
                    .tracker
                    .episodes()
                    .map(|e| (upstream.name.clone(), e.clone())),
            );
        }
        out.sort_by_key(|e| std::cmp::Reverse(e.1.start));
        out
    }

    /// The JSON of `/episodes`: every upstream's episodes, newest first.
    pub fn episodes_json(&self) -> String {
        super::json::document(&self.episodes())
    }

    /// Counts what a sweep (or an overflowing report) settled and ended.
    fn record(&self, upstream: &Arc<str>, outcome: SweepOutcome<HitchLabels>) {
        for settled in &outcome.settled {
            self.count_hitch(settled);
        }
        self.mark(upstream, &outcome.settled);
        let upstream: &str = upstream;
        let m = &self.batch_metrics;
        for episode in &outcome.ended {
            let seconds = match episode.end {
                Some(end) => (end - episode.start).max(0) as f64 * 1e-9,
                None => 0.0,
            };
            // The first stream caught: always among the IDs `/episodes` names for it.
            let caught = episode.stream_ids.first().map(|id| CounterExemplar {
                stream_id: id,
                trace_id: episode.first_trace_id.as_deref(),
                rank: seconds,
            });
            m.episodes.inc(&[upstream], caught.as_ref());
            let cause = episode.arrived.last();
            let observe = |family: &crate::metrics::HistogramFamily, value: f64| {
                let exemplar = cause.map(|arrival| Exemplar {
                    stream_id: &arrival.id,
                    trace_id: arrival.trace_id.as_deref(),
                    value,
                });
                family.observe_with(&[upstream], value, exemplar.as_ref());
            };
            observe(&self.metrics.batch_episode_duration, seconds);
            observe(&self.metrics.batch_episode_streams, episode.streams as f64);
            observe(
                &self.metrics.batch_episode_arrivals,
                episode.arrivals as f64,
            );
            tracing::debug!(
                upstream,
                episode = episode.id,
                streams = episode.streams,
                arrivals = episode.arrivals,
                seconds,
                "batch episode"
            );
        }
    }

    /// Keeps the settled hitches for `/streams/{id}`.
    fn mark(&self, upstream: &Arc<str>, settled: &[Settled<HitchLabels>]) {
        if settled.is_empty() {
            return;
        }
        let mut marks = self.marks.lock_or_recover();
        for s in settled {
            let us = |t: i64| u64::try_from((t - s.labels.received).max(0) / 1_000).unwrap_or(0);
            if marks.len() == MAX_MARKS {
                marks.pop_front();
            }
            marks.push_back((
                s.labels.stream.clone(),
                HitchMark {
                    event: s.labels.event,
                    phase: s.labels.phase,
                    from_us: us(s.start),
                    to_us: us(s.end),
                    scope: s.scope,
                    episode: s.episode,
                    upstream: upstream.clone(),
                },
            ));
        }
    }

    /// The settled hitches of stream `id` still kept, in order.
    pub fn hitches_of(&self, id: &str) -> Vec<HitchMark> {
        let marks = self.marks.lock_or_recover();
        marks
            .iter()
            .filter(|(stream, _)| stream.as_ref() == id)
            .map(|(_, mark)| mark.clone())
            .collect()
    }

    /// The settled batch-scope hitches of each of `ids` still kept, in order: one pass over
    /// the marks for a whole batch of ended streams (the span exporter's), where
    /// [`Self::hitches_of`] takes one pass per stream.
    pub fn batch_hitches_of(
        &self,
        ids: &std::collections::HashSet<&str>,
    ) -> std::collections::HashMap<Arc<str>, Vec<HitchMark>> {
        let mut out: std::collections::HashMap<Arc<str>, Vec<HitchMark>> = Default::default();
        if ids.is_empty() {
            return out;
        }
        let marks = self.marks.lock_or_recover();
        for (stream, mark) in marks.iter() {
            if mark.episode.is_some() && ids.contains(stream.as_ref()) {
                out.entry(stream.clone()).or_default().push(mark.clone());
            }
        }
        out
    }

    fn count_hitch(&self, settled: &Settled<HitchLabels>) {
        let labels = &settled.labels;
        let model = labels
            .model
            .clone()
            .unwrap_or_else(|| self.metrics.models.resolve(None));
        let exemplar = CounterExemplar {
            stream_id: &labels.stream,
            trace_id: labels.trace_id.as_deref(),
            rank: (settled.end - settled.start).max(0) as f64 * 1e-9,
        };
        self.batch_metrics.hitches.inc(
            &[&labels.route, &model, settled.scope.as_str()],
            Some(&exemplar),
        );
    }
}

// === impl UpstreamEpisodes ===

impl UpstreamEpisodes {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock_or_recover()
    }
}

/// How long an upstream's sweep outlives its last stream's end. At one stream at a time the next
/// stream then finds it running (its first token wakes it, after that token's write) instead of
/// spawning it anew before its head is written (2.7 µs on the first token's path by
/// `scripts/first-token-marks.sh`).
pub const SWEEP_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// The sweep of one upstream while it has streams, hitches waiting or an episode open, then for
/// [`SWEEP_LINGER`] more; then it ends (the next stream starts it again). It sleeps until the
/// next stream's deadline or hitch's settling (every interval only while streams are silent or
/// an episode is open), or until a stream's first token or hitch, so its cost follows the
/// streams that are due. Deadlines closer than one sweep interval wait for the interval: streams
/// streaming steadily are due every threshold or so each, and a wake-up per stream due (a timer,
/// a task poll) cost about 500 instructions per token event at 20 streams of 20 ms gaps; a
/// silence (and a first token) is noticed at most an interval late, as it was when every sweep
/// read every stream, and a hitch's times are the stream's own, not the sweep's.
async fn sweep(detector: Arc<BatchDetector>, upstream: Arc<UpstreamEpisodes>) {
    /// How long the sweep sleeps when nothing is due (a bound, in case a wake-up is missed).
    const IDLE_SWEEP: i64 = 1_000_000_000;
    let every = upstream.every;
    loop {
        let swept = {
            let mut inner = upstream.lock();
            if inner.tracker.idle() {
                inner.next_sweep = i64::MAX;
                None
            } else {
                let now = raw(Tick::now());
                let outcome = inner.tracker.sweep(now);
                // Nothing due: a stream's first token or hitch wakes the sweep before
                // this.
                let next = inner
                    .tracker
                    .next_work(now, every)
                    .unwrap_or(now + IDLE_SWEEP)
                    .max(now + every);
                inner.next_sweep = next;
                Some((outcome, next))
            }
        };
        let Some((outcome, next)) = swept else {
            // Nothing to watch: linger until SWEEP_LINGER after the last stream's end, so that
            // streams one after another do not each spawn a sweep. A stream that starts meanwhile
            // keeps it (it is not idle when the linger is over); its first token wakes it.
            let left = upstream.lock().linger_left(raw(Tick::now()));
            let woken = tokio::time::timeout(left, upstream.wake.notified()).await;
            let mut inner = upstream.lock();
            if woken.is_err()
                && inner.tracker.idle()
                && inner.linger_left(raw(Tick::now())).is_zero()
            {
                inner.sweeping = false;
                return;
            }
            continue;
        };
        detector.record(&upstream.name, outcome);
        let at = Tick::default().to_instant() + std::time::Duration::from_nanos(next.max(0) as u64);
        tokio::select! {
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
            () = upstream.wake.notified() => {}
        }
    }
}

/// One metered stream's side of the detector, owned by its ingress side.
#[derive(Debug)]
pub struct StreamProbe {
    upstream: Arc<UpstreamEpisodes>,
    key: u64,
    rule: HitchRule,
    beat: Arc<Beat>,
    last_token: Option<Tick>,
    labels: HitchLabels,
    /// Token events seen so far.
    events: u64,
    prompt_tokens: Option<u64>,
    detector: Arc<BatchDetector>,
}

// === impl StreamProbe ===

impl StreamProbe {
    /// A frame read at `at` carried `token_events` token events of phases `mix`; `model` is the
    /// stream's model label once known. Per frame: the rule and one relaxed store; a hitch takes
    /// the upstream's lock and carries the phase of the frame's first token event, the one that
    /// ended the gap.
    #[inline]
    pub fn token_events(
        &mut self,
        at: Tick,
        token_events: u32,
        mix: PhaseMix,
        model: Option<&Arc<str>>,
    ) {
        if token_events == 0 {
            return;
        }
        let first = match self.last_token {
            Some(last) => {
                let gap = i64::try_from(at.nanos_since(last)).unwrap_or(i64::MAX);
                if self.rule.gap(gap) {
                    self.report(last, at, mix.first(), model);
                }
                false
            }
            None => true,
        };
        self.events += u64::from(token_events);
        self.last_token = Some(at);
        if self.beat.token(raw(at), self.rule.threshold_nanos()) {
            self.woke();
        }
        if first {
            self.first(at);
        }
    }

    /// The sweep counted the stream silent and its beat changed (not by a hitch, whose report
    /// says as much): the next sweep reads it again. Rare: a stop that begins or ends, a gap
    /// that overlapped one, or a token whose frame was read before a sweep and stored after it.
    #[cold]
    fn woke(&self) {
        self.upstream.lock().tracker.woke(self.key);
    }

    /// The stream's first token event came at `at`: the sweep reads it from now on (one lock
    /// in a stream's life; until now the sweep never read it), at most an interval late, as it
    /// notices a silence: it is woken only when it would run later than that (while streams are
    /// due it runs every interval, and a wake-up per stream cost a sweep each, and an eventfd
    /// write when the sweep's worker was parked). Called after the beat holds the token: the
    /// sweep, on another thread, may read the beat at once.
    #[cold]
    fn first(&self, at: Tick) {
        let late = {
            let mut inner = self.upstream.lock();
            inner.tracker.first_token(self.key, raw(at));
            inner.next_sweep > raw(at).saturating_add(self.upstream.every)
        };
        if late {
            self.upstream.wake.notify_one();
        }
    }

    /// The stream is held back by its client (a stop began): its silence is not the engine's, so
    /// the sweep must not count it inside a hitch until it is read again.
    #[cold]
    pub fn hold(&self) {
        if self.beat.hold() {
            self.woke();
        }
    }

    /// The stop ended at `at`: the stream is read again, and its silence counts from now.
    #[cold]
    pub fn release(&self, at: Tick) {
        if self.last_token.is_some() && self.beat.token(raw(at), self.rule.threshold_nanos()) {
            self.woke();
        }
    }

    /// A frame read at `at` carried `token_events` token events whose gap overlapped a stop: the
    /// gap is not judged (no hitch, and it stays out of the running median).
    #[cold]
    pub fn resume(&mut self, at: Tick, token_events: u32) {
        if token_events == 0 {
            return;
        }
        let first = self.last_token.is_none();
        self.events += u64::from(token_events);
        self.last_token = Some(at);
        if self.beat.token(raw(at), self.rule.threshold_nanos()) {
            self.woke();
        }
        if first {
            self.first(at);
        }
    }

    #[cold]
    fn report(&mut self, start: Tick, end: Tick, phase: Phase, model: Option<&Arc<str>>) {
        if self.labels.model.is_none() {
            self.labels.model = model.cloned();
        }
        self.labels.event = self.events;
        self.labels.phase = phase;
        let overflow = self.upstream.lock().tracker.hitch(
            self.key,
            raw(start),
            raw(end),
            phase,
            self.labels.clone(),
        );
        self.upstream.wake.notify_one();
        if let Some(settled) = overflow {
            self.detector.count_hitch(&settled);
            self.detector
                .mark(&self.upstream.name, std::slice::from_ref(&settled));
        }
    }

    /// The stream reported its prompt tokens (usage), for the arrivals that name it.
    pub fn prompt_tokens(&mut self, tokens: Option<u64>) {
        self.prompt_tokens = tokens.or(self.prompt_tokens);
    }
}

impl Drop for StreamProbe {
    fn drop(&mut self) {
        let ended = raw(Tick::now());
        let mut inner = self.upstream.lock();
        inner.tracker.end(self.key, self.prompt_tokens);
        inner.last_end = ended;
    }
}

/// A tick as nanoseconds since the clock's origin (never 0 in practice; see [`Beat`]).
fn raw(tick: Tick) -> i64 {
    i64::try_from(tick.nanos_since(Tick::default())).unwrap_or(i64::MAX)
}

/// A duration in nanoseconds, saturating.
fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Buckets, ModelLabels};
    use std::time::Duration;

    /// A detector on one upstream, whose metrics go nowhere else.
    fn detector(settings: BatchSettings) -> (Arc<BatchDetector>, Upstream) {
        let metrics = Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 8),
            Duration::from_millis(500),
        );
        let metrics = Arc::new(metrics.unwrap());
        let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
        let detector = BatchDetector::new(settings, metrics, &upstream).unwrap();
        (detector, upstream)
    }

    /// Opens stream `id` on `upstream` (route "chat"), received now.
    fn open_now(detector: &Arc<BatchDetector>, upstream: &Upstream, id: &str) -> StreamProbe {
        let route: Arc<str> = Arc::from("chat");
        detector
            .open(upstream, Arc::from(id), None, route, Tick::now(), None)
            .unwrap()
    }

    /// Waits (in real time, up to 5 s) until the sweep's next run time is no longer `asleep`:
    /// the sweep ran. Returns how long that took.
    async fn until_swept(episodes: &UpstreamEpisodes, asleep: i64) -> Duration {
        let woken = std::time::Instant::now();
        while episodes.lock().next_sweep == asleep && woken.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        woken.elapsed()
    }

    /// An upstream's sweep outlives its last stream by [`SWEEP_LINGER`]: a stream that starts
    /// meanwhile finds it rather than spawning another, and once the linger passes with no
    /// stream the sweep ends, no sooner than the linger after the last stream's end, even when
    /// that stream started and ended inside an earlier stream's linger (waited for up to ten
    /// lingers, in real time).
    #[tokio::test]
    async fn a_sweep_outlives_its_last_stream_by_its_linger_then_ends() {
        let (detector, upstream) = detector(BatchSettings::default());
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let open = |id: &str| open_now(&detector, &upstream, id);
        let first = open("s0");
        assert_eq!(tasks(), 1);
        drop(first);
        tokio::time::sleep(SWEEP_LINGER / 2).await;
        assert_eq!(tasks(), 1, "the sweep lingers after its last stream");
        let second = open("s1");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            tasks(),
            1,
            "a stream in the linger finds the sweep, not a new one"
        );
        drop(second);
        let ended = std::time::Instant::now();
        while tasks() > 0 && ended.elapsed() < SWEEP_LINGER * 10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(tasks(), 0, "the sweep ends once the linger passed");
        assert!(ended.elapsed() >= SWEEP_LINGER, "{:?}", ended.elapsed());
        let third = open("s2");
        assert_eq!(tasks(), 1, "the next stream starts it again");
        drop(third);
    }

    /// A stream's start does not wake a sweep that has streams; its first token wakes a sweep
    /// that sleeps for longer than an interval (nothing else due), so that the sweep reads it
    /// at once (in real time; the sweep's next run time tells whether it ran).
    #[tokio::test]
    async fn a_first_token_wakes_a_sweep_that_sleeps_long_and_a_start_does_not() {
        let (detector, upstream) = detector(BatchSettings::default());
        let episodes = detector.upstream(&upstream);
        let next_sweep = || episodes.lock().next_sweep;
        let open = |id: &str| open_now(&detector, &upstream, id);
        let mut first = open("s0");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The sweep ran: one stream without a first token, nothing due for a second.
        let asleep = next_sweep();
        assert!(asleep > raw(Tick::now()) + 500_000_000, "{asleep}");
        let _second = open("s1");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            next_sweep(),
            asleep,
            "a start does not wake a sweep with streams"
        );
        first.token_events(Tick::now(), 1, PhaseMix::ALL_CONTENT, None);
        let took = until_swept(&episodes, asleep).await;
        assert!(next_sweep() < asleep, "the first token woke the sweep");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }

    /// A stream that starts while the sweep lingers with nothing to watch does not wake it (the
    /// sweep would run between the stream's head and its first token); its first token does (in
    /// real time; the sweep's next run time tells whether it ran).
    #[tokio::test]
    async fn a_start_in_the_linger_leaves_the_sweep_asleep_and_its_first_token_wakes_it() {
        let (detector, upstream) = detector(BatchSettings::default());
        let episodes = detector.upstream(&upstream);
        let next_sweep = || episodes.lock().next_sweep;
        let open = |id: &str| open_now(&detector, &upstream, id);
        drop(open("s0"));
        let lingering = std::time::Instant::now();
        while next_sweep() != i64::MAX && lingering.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(next_sweep(), i64::MAX, "the sweep lingers");
        let mut second = open("s1");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            next_sweep(),
            i64::MAX,
            "a start does not wake a lingering sweep"
        );
        second.token_events(Tick::now(), 1, PhaseMix::ALL_CONTENT, None);
        let took = until_swept(&episodes, i64::MAX).await;
        assert!(next_sweep() < i64::MAX, "the first token woke the sweep");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }

    /// A hitch carries the phase of the frame's first token event, the one that ended the gap:
    /// its mark shows it and its episode counts it.
    #[tokio::test]
    async fn a_hitch_carries_the_phase_of_the_token_that_ended_it() {
        // Every co-stall that passes the floors is an episode (the chance rule is not tested here).
        let (detector, upstream) = detector(BatchSettings {
            false_positive: 1.0,
            ..BatchSettings::default()
        });
        let model: Arc<str> = Arc::from("m");
        // 30 token events 20 ms apart, a 400 ms wait of every stream at once, 10 more, in real
        // time (the sweep reads it as it happens): the frame after the wait is reasoning on even
        // streams, tool_call on odd ones.
        let mut probes: Vec<StreamProbe> = (0..10)
            .map(|i| {
                let id: Arc<str> = Arc::from(format!("s{i}"));
                let route: Arc<str> = Arc::from("chat");
                let received = Tick::now();
                detector
                    .open(&upstream, id, None, route, received, None)
                    .unwrap()
            })
            .collect();
        for k in (0..30).chain(50..60) {
            let pause = if k == 50 { 420 } else { 20 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let at = Tick::now();
            for (i, probe) in probes.iter_mut().enumerate() {
                let mut mix = PhaseMix::ALL_CONTENT;
                if k == 50 {
                    mix.add([Phase::Reasoning, Phase::ToolCall][i % 2], true);
                    mix.add(Phase::Reasoning, false);
                }
                probe.token_events(at, 2, mix, Some(&model));
            }
        }
        // The streams end before their silence after the last token makes an episode too.
        drop(probes);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A loaded machine's pause may add hitches (content) elsewhere: the wait's are exact.
        let mut episode = None;
        for (i, phase) in [(0, Phase::Reasoning), (1, Phase::ToolCall)] {
            let marks = detector.hitches_of(&format!("s{i}"));
            let mark = marks
                .iter()
                .find(|m| m.event == 60)
                .expect("the wait's hitch");
            assert_eq!(mark.phase, phase, "{marks:?}");
            assert_eq!(mark.scope, super::super::Scope::Batch, "{marks:?}");
            episode = mark.episode;
        }
        let episodes = detector.episodes();
        let (_, caught) = (episodes.iter())
            .find(|(_, e)| Some(e.id) == episode)
            .expect("the wait's episode");
        let [reasoning, _, tool_call] = caught.hitch_phases;
        assert_eq!((reasoning, tool_call), (5, 5));
        let json: serde_json::Value = serde_json::from_str(&detector.episodes_json()).unwrap();
        let shown = json["episodes"].as_array().unwrap().iter();
        let shown = shown
            .clone()
            .find(|e| Some(e["id"].as_u64().unwrap()) == episode);
        let phases = &shown.unwrap()["hitches_by_phase"];
        assert_eq!(
            (&phases["reasoning"], &phases["tool_call"]),
            (&5.into(), &5.into())
        );
    }
}
