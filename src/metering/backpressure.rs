//! Backpressure: the intervals in which a stream is held back by its client (docs/design.md,
//! section 3), so that a gap a slow reader caused is never blamed on the engine.
//!
//! A **stop** begins when the stream's reader task parks because its queue is full (the client
//! cannot take more: HTTP/1 after its socket refused a write, HTTP/2 under flow control, or the
//! server not polling), and ends when the client takes a queued frame. An **episode** is a run of
//! stops: it begins with the first and ends when the queue is empty again or the upstream side
//! ends. While a stop is open nothing reads the upstream, so the next ingress gap overlaps it:
//! that gap stays in the ingress ITL histogram, but it is neither a stall nor a hitch.
//!
//! [`StreamBackpressure`] is one stream's state, pure (every moment is passed in) and kept under
//! the lock its frames already take; the clock is read only to open or close a stop.
//! [`Backpressure`] holds the two counters and each finished stream's marks for `/streams/{id}`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, Opts};

use super::clock::Tick;
use crate::poison::LockExt;

/// Marks kept per stream; later episodes are only counted (`backpressure_dropped`).
pub const MAX_MARKS_PER_STREAM: usize = 64;

/// Streams whose marks are kept for `/streams/{id}` (oldest dropped first).
pub const MAX_STREAMS_MARKED: usize = 4096;

/// One backpressure episode of a stream, as `/streams/{id}` marks it. Times are microseconds from
/// the stream's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackpressureMark {
    /// When the first stop began (the reader parked on a full queue).
    pub from_us: u64,
    /// When the episode ended (the queue emptied, or the upstream side ended).
    pub to_us: u64,
    /// The time inside stops: the upstream was not read at all.
    pub held_us: u64,
}

/// A finished stream's marks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamMarks {
    /// The first [`MAX_MARKS_PER_STREAM`] episodes, in order.
    pub marks: Vec<BackpressureMark>,
    /// Episodes past them, counted only.
    pub dropped: u64,
}

/// The counters and the finished streams' marks, shared by every stream.
#[derive(Debug)]
pub struct Backpressure {
    seconds: CounterVec,
    episodes: IntCounterVec,
    marks: Mutex<VecDeque<(Arc<str>, StreamMarks)>>,
}

// === impl Backpressure ===

impl Backpressure {
    /// Creates `metronome_backpressure_seconds_total{route}` and
    /// `metronome_backpressure_episodes_total{route}` and registers them with `metrics`.
    pub fn register(metrics: &crate::metrics::Metrics) -> prometheus::Result<Arc<Self>> {
        let seconds = CounterVec::new(
            Opts::new(
                "metronome_backpressure_seconds_total",
                "Time streams were held back by their clients: the reader parked on a full queue, so the upstream was not read.",
            ),
            &["route"],
        )?;
        let episodes = IntCounterVec::new(
            Opts::new(
                "metronome_backpressure_episodes_total",
                "Intervals of backpressure: from a stream's first stop on a full queue until its queue is empty again.",
            ),
            &["route"],
        )?;
        metrics.register(Box::new(seconds.clone()))?;
        metrics.register(Box::new(episodes.clone()))?;
        Ok(Arc::new(Backpressure {
            seconds,
            episodes,
            marks: Mutex::new(VecDeque::new()),
        }))
    }

    /// The counters of `route`, looked up once per stream, at its first stop.
    fn series(&self, route: &str) -> Series {
        Series {
            seconds: self.seconds.with_label_values(&[route]),
            episodes: self.episodes.with_label_values(&[route]),
        }
    }

    /// Keeps a finished stream's marks (one lock per stream that was held back).
    fn keep(&self, id: Arc<str>, marks: StreamMarks) {
        let mut kept = self.marks.lock_or_recover();
        if kept.len() == MAX_STREAMS_MARKED {
            kept.pop_front();
        }
        kept.push_back((id, marks));
    }

    /// The marks of stream `id`, if it was held back and is still kept.
    pub fn marks_of(&self, id: &str) -> Option<StreamMarks> {
        let kept = self.marks.lock_or_recover();
        kept.iter()
            .rev()
            .find(|(stream, _)| stream.as_ref() == id)
            .map(|(_, marks)| marks.clone())
    }
}

#[derive(Debug)]
struct Series {
    seconds: Counter,
    episodes: IntCounter,
}

/// What a stream's backpressure changed for the caller to pass on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// A stop began: the next ingress gap is held (not a stall, not a hitch).
    Held,
    /// A stop ended at this moment: the stream is read again.
    Released(Tick),
}

/// One stream's backpressure, kept beside its queue.
#[derive(Debug, Default)]
pub struct StreamBackpressure {
    /// When the open stop began.
    stop: Option<Tick>,
    /// When the open episode began, and the stop time in it so far (nanoseconds).
    episode: Option<(Tick, u64)>,
    /// A stop began since the last token event: the next gap overlaps it.
    gap_held: bool,
    marks: StreamMarks,
    series: Option<Series>,
}

// === impl StreamBackpressure ===

impl StreamBackpressure {
    /// Whether the next token event's gap overlaps a stop (read once per frame, a load).
    #[inline]
    pub fn gap_held(&self) -> bool {
        self.gap_held
    }

    /// The held gap has ended at a token event.
    pub fn gap_taken(&mut self) {
        self.gap_held = false;
    }

    /// Whether a stop is open.
    pub fn stopped(&self) -> bool {
        self.stop.is_some()
    }

    /// The reader parks on a full queue at `now()` (the clock is read only when a stop opens).
    pub fn park(&mut self, now: impl FnOnce() -> Tick) -> Change {
        if self.stop.is_some() {
            return Change::None;
        }
        let at = now();
        self.stop = Some(at);
        self.episode.get_or_insert((at, 0));
        self.gap_held = true;
        Change::Held
    }

    /// The client took a queued frame: an open stop ends at `now()` (read only then), its time
    /// counted for `route`.
    pub fn taken(
        &mut self,
        route: &str,
        registry: &Backpressure,
        now: impl FnOnce() -> Tick,
    ) -> Change {
        let Some(from) = self.stop.take() else {
            return Change::None;
        };
        let at = now();
        let held = at.nanos_since(from);
        if let Some((_, total)) = self.episode.as_mut() {
            *total += held;
        }
        let series = self.series.get_or_insert_with(|| registry.series(route));
        series.seconds.inc_by(held as f64 * 1e-9);
        Change::Released(at)
    }

    /// The queue is empty (or the upstream side ended) at `at`: an open episode ends, after its
    /// stop if one is open. `received` is the stream's receipt, for the mark.
    pub fn drained(
        &mut self,
        route: &str,
        registry: &Backpressure,
        received: Tick,
        at: Tick,
    ) -> Change {
        let released = self.taken(route, registry, || at);
        let Some((from, held)) = self.episode.take() else {
            return released;
        };
        let series = self.series.get_or_insert_with(|| registry.series(route));
        series.episodes.inc();
        if self.marks.marks.len() < MAX_MARKS_PER_STREAM {
            let us = |t: Tick| t.nanos_since(received) / 1_000;
            self.marks.marks.push(BackpressureMark {
                from_us: us(from),
                to_us: us(at),
                held_us: held / 1_000,
            });
        } else {
            self.marks.dropped += 1;
        }
        released
    }

    /// Whether an episode is open (the queue has not emptied since its first stop).
    pub fn in_episode(&self) -> bool {
        self.episode.is_some()
    }

    /// Whether the stream was ever held back (an episode open, or marks to keep).
    pub fn touched(&self) -> bool {
        self.episode.is_some() || !self.marks.marks.is_empty() || self.marks.dropped > 0
    }

    /// The upstream side ended at `at`: closes what is open and keeps the stream's marks, if it
    /// was ever held back.
    pub fn finish(
        &mut self,
        id: &Arc<str>,
        route: &str,
        registry: &Backpressure,
        received: Tick,
        at: Tick,
    ) {
        self.drained(route, registry, received, at);
        if self.marks.marks.is_empty() {
            return;
        }
        registry.keep(id.clone(), std::mem::take(&mut self.marks));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> (crate::metrics::Metrics, Arc<Backpressure>) {
        let metrics = crate::metrics::Metrics::new(
            &crate::metrics::Buckets::default(),
            crate::metrics::ModelLabels::new(&[], 8),
            std::time::Duration::from_millis(200),
        )
        .unwrap();
        let bp = Backpressure::register(&metrics).unwrap();
        (metrics, bp)
    }

    fn at(ms: i64) -> Tick {
        Tick::from_instant(
            Tick::default().to_instant() + std::time::Duration::from_millis(ms as u64),
        )
    }

    #[test]
    fn stops_make_one_episode_until_the_queue_empties() {
        let (metrics, bp) = registry();
        let mut s = StreamBackpressure::default();
        assert_eq!(s.park(|| at(100)), Change::Held);
        assert!(s.gap_held());
        assert_eq!(
            s.park(|| unreachable!("no clock read while a stop is open")),
            Change::None
        );
        assert_eq!(s.taken("r", &bp, || at(400)), Change::Released(at(400)));
        assert_eq!(
            s.taken("r", &bp, || unreachable!("no stop open")),
            Change::None
        );
        s.gap_taken();
        assert!(!s.gap_held());
        s.park(|| at(410));
        s.taken("r", &bp, || at(510));
        s.drained("r", &bp, at(0), at(600));
        assert!(!s.in_episode());
        let id: Arc<str> = Arc::from("s1");
        s.finish(&id, "r", &bp, at(0), at(700));
        let marks = bp.marks_of("s1").unwrap();
        assert_eq!(
            marks.marks,
            vec![BackpressureMark {
                from_us: 100_000,
                to_us: 600_000,
                held_us: 400_000
            }]
        );
        let text = metrics.encode();
        assert!(
            text.contains("metronome_backpressure_episodes_total{route=\"r\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("metronome_backpressure_seconds_total{route=\"r\"} 0.4"),
            "{text}"
        );
    }

    #[test]
    fn a_stream_never_held_back_has_no_series_and_no_marks() {
        let (metrics, bp) = registry();
        let mut s = StreamBackpressure::default();
        s.drained("r", &bp, at(0), at(5));
        s.finish(&Arc::from("s2"), "r", &bp, at(0), at(10));
        assert!(bp.marks_of("s2").is_none());
        let text = metrics.encode();
        assert!(!text.contains("metronome_backpressure_seconds_total"));
        assert!(!text.contains("metronome_backpressure_episodes_total"));
    }

    #[test]
    fn marks_are_bounded_per_stream() {
        let (_metrics, bp) = registry();
        let mut s = StreamBackpressure::default();
        for i in 0..(MAX_MARKS_PER_STREAM as i64 + 5) {
            s.park(|| at(i * 10));
            s.drained("r", &bp, at(0), at(i * 10 + 5));
        }
        s.finish(&Arc::from("s3"), "r", &bp, at(0), at(10_000));
        let marks = bp.marks_of("s3").unwrap();
        assert_eq!(marks.marks.len(), MAX_MARKS_PER_STREAM);
        assert_eq!(marks.dropped, 5);
    }

    #[test]
    fn an_open_stop_ends_with_the_stream() {
        let (_metrics, bp) = registry();
        let mut s = StreamBackpressure::default();
        s.park(|| at(50));
        s.finish(&Arc::from("s4"), "r", &bp, at(0), at(80));
        let marks = bp.marks_of("s4").unwrap();
        assert_eq!(marks.marks[0].held_us, 30_000);
    }
}
