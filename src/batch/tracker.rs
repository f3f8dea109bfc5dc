//! The episode tracker of one upstream (one engine): which of its streams are inside a hitch at
//! the same time, when that makes an episode, which requests arrived just before it, and, once
//! settled, each hitch's scope. Pure: every moment is passed in, nothing reads a clock or locks.
//!
//! Its state is a slot per active stream plus bounded rings (arrivals, episodes, hitches waiting
//! for their scope). It learns of hitches in two ways: a stream reports each hitch gap when the
//! token that ends it arrives ([`EpisodeTracker::hitch`]), and a sweep ([`EpisodeTracker::sweep`],
//! run on a timer per upstream, not per frame) reads a stream's last token time and threshold
//! from its [`Beat`] when its deadline in a min-heap comes, and counts a stream silent for longer
//! than its threshold as inside a hitch while the silence lasts, so an episode is seen while it
//! happens. A silent stream's beat is watched: the stream tells the tracker when it next writes
//! it (its hitch's report, or [`EpisodeTracker::woke`]), and only then is it read again; so a
//! sweep's cost follows what changed (deadlines come, silences ended, hitches reported, streams
//! fallen silent), not how many streams are open or silent. At each sweep the streams inside a
//! hitch are those silent now and those whose reported hitch ended since the previous sweep; an
//! episode is open while they are at least `min_streams` and at least `min_share` of the streams
//! past their first token. A reported hitch gets its scope a settling time after its end (two
//! sweeps), when every episode it could overlap has been seen.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{fence, AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use super::chance::{self, Decayed};
use super::silent::SilentList;
use super::BatchSettings;
use crate::format::Phase;

/// Arrivals remembered per upstream (the lookback reads them).
pub const MAX_ARRIVALS: usize = 256;
/// Finished episodes remembered per upstream (for `/episodes` and for late scopes).
pub const MAX_EPISODES: usize = 64;
/// Stream IDs an episode names (its stream count stays exact beyond).
pub const MAX_CAUGHT_IDS: usize = 64;
/// Arrivals an episode names (its arrival count stays exact beyond).
pub const MAX_EPISODE_ARRIVALS: usize = 32;
/// Hitches waiting for their scope; beyond, the oldest is settled at once.
pub const MAX_PENDING: usize = 4096;
/// The longest a stream waits in the deadline heap before its beat is read again (a stream held
/// back by its client, or one whose threshold shrank since its deadline was set).
const MAX_RECHECK: i64 = 1_000_000_000;
/// How soon a stream whose beat had no token yet is read again.
const MIN_RECHECK: i64 = 10_000_000;

/// What a stream's ingress side publishes for the sweep: written by the stream alone (relaxed
/// stores to its own line per token event), read by the sweep. 0 means "no token yet".
///
/// While the sweep counts the stream silent past its threshold it *watches* the beat, and the
/// stream, after each write, tells the tracker ([`EpisodeTracker::woke`]) if it is watched, so
/// a silent stream's beat is read again only when it changed, not at every sweep. The two sides
/// order their write and their read by a sequentially consistent fence each (the stream: write
/// the beat, fence, read `watched`; the sweep: set `watched`, fence, read the beat): either the
/// stream sees it watched or the sweep sees its write, so no write to a watched beat goes
/// unnoticed.
#[derive(Debug, Default)]
pub struct Beat {
    last_token: AtomicI64,
    threshold: AtomicI64,
    watched: AtomicBool,
}

// === impl Beat ===

impl Beat {
    /// A token event came at `at` (nanoseconds, never 0), and the stream's silence threshold
    /// is now `threshold`. Returns whether the sweep counts the stream silent: then the stream
    /// must tell the tracker ([`EpisodeTracker::woke`], or a hitch's report).
    #[inline]
    #[must_use = "a watched beat's write must be told to the tracker"]
    pub fn token(&self, at: i64, threshold: i64) -> bool {
        self.last_token.store(at.max(1), Ordering::Relaxed);
        self.threshold.store(threshold, Ordering::Relaxed);
        self.watched_after_write()
    }

    /// The stream is held back by its client: no silence makes it inside a hitch until its next
    /// token event (or the end of the stop) stores a threshold again. Returns what
    /// [`Self::token`] returns.
    #[must_use = "a watched beat's write must be told to the tracker"]
    pub fn hold(&self) -> bool {
        self.threshold.store(i64::MAX, Ordering::Relaxed);
        self.watched_after_write()
    }

    /// After a write: whether the sweep watches the beat (the stream's half of the fences).
    #[inline]
    fn watched_after_write(&self) -> bool {
        fence(Ordering::SeqCst);
        self.watched.load(Ordering::Relaxed)
    }

    /// The sweep counts the stream silent: every later write is told (the sweep's half; the
    /// beat must be read again after it).
    fn watch(&self) {
        self.watched.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The sweep no longer counts the stream silent, or the stream told it of a write.
    fn unwatch(&self) {
        self.watched.store(false, Ordering::Relaxed);
    }

    fn read(&self) -> (i64, i64) {
        (
            self.last_token.load(Ordering::Relaxed),
            self.threshold.load(Ordering::Relaxed),
        )
    }
}

/// The hasher of the tracker's stream keys. They come from a counter the detector keeps, never
/// from a peer, so the table needs spread, not SipHash's resistance to chosen keys: a multiply
/// by 2^64/φ spreads consecutive keys over every bit. SipHash took about a tenth of the sweep's
/// time with 5,000 streams inside a hitch (perf, `open-streams-cpu.sh` at one token a second).
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Whether a hitch hit the whole batch or one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// It overlaps an episode of its upstream.
    Batch,
    /// It does not.
    Stream,
}

// === impl Scope ===

impl Scope {
    /// The `scope` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Batch => "batch",
            Scope::Stream => "stream",
        }
    }
}

/// A request the upstream received, as an episode names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The tracker's key of the stream.
    pub key: u64,
    /// The stream's ID.
    pub id: Arc<str>,
    /// The trace ID of its request's `traceparent`, when it had one (for exemplars).
    pub trace_id: Option<Arc<str>>,
    /// When it was received (nanoseconds).
    pub at: i64,
    /// Its request body's declared size, when it declared one.
    pub body_bytes: Option<u64>,
    /// Its prompt tokens, once the stream reported them (`usage`).
    pub prompt_tokens: Option<u64>,
}

/// An episode: a stretch during which much of the batch was inside a hitch at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Episode {
    /// Its number on this upstream, from 1.
    pub id: u64,
    /// When the first of its hitches began (nanoseconds).
    pub start: i64,
    /// When it ended; `None` while it lasts.
    pub end: Option<i64>,
    /// Streams caught in it (exact).
    pub streams: usize,
    /// The first [`MAX_CAUGHT_IDS`] of them.
    pub stream_ids: Vec<Arc<str>>,
    /// The trace ID of the first caught stream's request, when it had a `traceparent`.
    pub first_trace_id: Option<Arc<str>>,
    stream_keys: Vec<u64>,
    /// Requests received within the lookback before `start` (exact).
    pub arrivals: usize,
    /// The last [`MAX_EPISODE_ARRIVALS`] of them, oldest first.
    pub arrived: Vec<Arrival>,
    /// Its batch-scope hitches, by the phase of the token event that ended each gap
    /// ([`Phase::index`]'s order): counted as each settles, a settling time after its end.
    pub hitch_phases: [u64; 3],
}

/// A hitch that got its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled<L> {
    /// The stream's key.
    pub key: u64,
    /// Where the gap began and ended (nanoseconds).
    pub start: i64,
    /// Its end.
    pub end: i64,
    /// Its scope.
    pub scope: Scope,
    /// The episode it overlaps, when batch.
    pub episode: Option<u64>,
    /// What the reporter attached (labels).
    pub labels: L,
}

/// What a sweep produced: hitches settled, episodes ended.
#[derive(Debug)]
pub struct SweepOutcome<L> {
    /// Hitches whose scope is now known.
    pub settled: Vec<Settled<L>>,
    /// Episodes that ended at this sweep.
    pub ended: Vec<Episode>,
    /// An episode began at this sweep.
    pub began: bool,
}

impl<L> Default for SweepOutcome<L> {
    fn default() -> Self {
        SweepOutcome {
            settled: Vec::new(),
            ended: Vec::new(),
            began: false,
        }
    }
}

#[derive(Debug)]
struct Slot {
    key: u64,
    id: Arc<str>,
    trace_id: Option<Arc<str>>,
    beat: Arc<Beat>,
    /// The latest reported hitch `(start, end)`, for the sweep after it.
    reported: Option<(i64, i64)>,
    /// When the stream began (its observed time for the chance rule runs from here).
    start: i64,
    /// Its beat showed a token event: it counts among the streams past their first token.
    past_first: bool,
    /// It is in the tracker's list of streams silent past their threshold (not in the heap),
    /// and its beat is watched.
    silent: bool,
    /// Its entry in that list, while silent.
    silent_entry: u64,
    /// Where its silence began (its last token event as read), while silent.
    silent_since: i64,
    /// It is in the list of silent streams whose beat changed since the last sweep.
    woken_listed: bool,
    /// It is in the list of streams with a hitch reported since the last sweep.
    reported_listed: bool,
    /// The number of the last episode that caught it (0: none), so each is counted once.
    caught: u64,
    /// Seconds inside hitches of its own (`scope="stream"`), decayed over `rate_window`.
    hitched: Decayed,
}

#[derive(Debug)]
struct Pending<L> {
    key: u64,
    start: i64,
    end: i64,
    /// The phase of the token event that ended the gap.
    phase: Phase,
    labels: L,
}

/// The tracker of one upstream; `L` is what a hitch's reporter attaches (its labels).
#[derive(Debug)]
pub struct EpisodeTracker<L> {
    settings: BatchSettings,
    streams: HashMap<u64, Slot, BuildHasherDefault<KeyHasher>>,
    /// When each stream's beat must be read next: its silence deadline (`last + threshold`),
    /// lazily: an entry whose stream has had a token since is pushed again further on.
    due: BinaryHeap<Reverse<(i64, u64)>>,
    /// Streams silent past their threshold now: inside a hitch until their beat changes.
    silent: SilentList,
    /// Silent streams whose beat changed since the last sweep (they told it): read again then.
    woken: Vec<u64>,
    /// Streams with a hitch reported since the last sweep.
    reported: Vec<u64>,
    /// Streams whose beat has shown a token event.
    past_first: usize,
    /// The streams inside a hitch at the last sweep by a reported hitch, not silent (its
    /// scratch list, kept for its capacity).
    inside: Vec<u64>,
    /// Beats read so far, each a look-up and likely a cache miss: what the sweep's work is made
    /// of besides the changes it handles.
    pub beat_reads: u64,
    arrivals: VecDeque<Arrival>,
    episodes: VecDeque<Episode>,
    open: Option<Episode>,
    pending: VecDeque<Pending<L>>,
    last_sweep: i64,
    /// How long a reported hitch waits for its scope.
    settle: i64,
    next_episode: u64,
    /// Hitches settled at once because `pending` was full.
    pub overflowed: u64,
    /// The upstream's seconds inside hitches of their own, over all its streams, decayed.
    pool_hitched: Decayed,
    /// The upstream's stream-seconds observed past the first token, decayed.
    pool_observed: Decayed,
    /// The chance rule's verdict at the last co-stall that passed the floors.
    pub last_verdict: Option<chance::Verdict>,
}

// === impl EpisodeTracker ===

impl<L> EpisodeTracker<L> {
    /// An empty tracker swept every `sweep_nanos`.
    pub fn new(settings: BatchSettings, sweep_nanos: i64) -> Self {
        EpisodeTracker {
            settings,
            streams: HashMap::default(),
            due: BinaryHeap::new(),
            silent: SilentList::default(),
            woken: Vec::new(),
            reported: Vec::new(),
            past_first: 0,
            inside: Vec::new(),
            beat_reads: 0,
            arrivals: VecDeque::new(),
            episodes: VecDeque::new(),
            open: None,
            pending: VecDeque::new(),
            last_sweep: 0,
            settle: 2 * sweep_nanos.max(1),
            next_episode: 1,
            overflowed: 0,
            pool_hitched: Decayed::default(),
            pool_observed: Decayed::default(),
            last_verdict: None,
        }
    }

    /// Active streams.
    pub fn active(&self) -> usize {
        self.streams.len()
    }

    /// Nothing left to do: no stream, no hitch waiting, no episode open.
    pub fn idle(&self) -> bool {
        self.streams.is_empty() && self.pending.is_empty() && self.open.is_none()
    }

    /// A stream began at `at`: it is an arrival, and its beat is read from now on. `trace_id` is
    /// its request's trace, when it had a `traceparent`.
    pub fn start(
        &mut self,
        key: u64,
        id: Arc<str>,
        trace_id: Option<Arc<str>>,
        at: i64,
        body_bytes: Option<u64>,
        beat: Arc<Beat>,
    ) {
        if self.arrivals.len() == MAX_ARRIVALS {
            self.arrivals.pop_front();
        }
        self.arrivals.push_back(Arrival {
            key,
            id: id.clone(),
            trace_id: trace_id.clone(),
            at,
            body_bytes,
            prompt_tokens: None,
        });
        self.streams.insert(
            key,
            Slot {
                key,
                id,
                trace_id,
                beat,
                reported: None,
                start: at,
                hitched: Decayed::default(),
                past_first: false,
                silent: false,
                silent_entry: 0,
                silent_since: 0,
                woken_listed: false,
                reported_listed: false,
                caught: 0,
            },
        );
    }

    /// Stream `key` had its first token event at `at`: from now on its beat is read when its
    /// deadline comes. Until then it has no deadline and costs no sweep: a stream waiting for
    /// its first token cannot be inside a hitch (hitches are gaps between token events), and
    /// thousands of them waiting (long prompts, a queue) would otherwise be read again and again.
    pub fn first_token(&mut self, key: u64, at: i64) {
        if self.streams.contains_key(&key) {
            self.due.push(Reverse((at, key)));
        }
    }

    /// A stream ended; `prompt_tokens` is what its usage said, if anything.
    pub fn end(&mut self, key: u64, prompt_tokens: Option<u64>) {
        if let Some(slot) = self.streams.remove(&key) {
            if slot.past_first {
                self.past_first -= 1;
            }
            if slot.silent {
                self.silent.leave();
            }
            // Its heap entry and list places are dropped lazily, when next read.
        }
        let Some(tokens) = prompt_tokens else {
            return;
        };
        let named = self
            .arrivals
            .iter_mut()
            .chain(self.open.iter_mut().flat_map(|e| e.arrived.iter_mut()))
            .chain(self.episodes.iter_mut().flat_map(|e| e.arrived.iter_mut()));
        for arrival in named.filter(|a| a.key == key) {
            arrival.prompt_tokens = Some(tokens);
        }
    }

    /// A stream's gap from `start` to `end`, ended by a token event of `phase`, was a hitch; its
    /// scope comes with a later sweep.
    pub fn hitch(
        &mut self,
        key: u64,
        start: i64,
        end: i64,
        phase: Phase,
        labels: L,
    ) -> Option<Settled<L>> {
        if let Some(slot) = self.streams.get_mut(&key) {
            slot.reported = Some((start, end));
            if !std::mem::replace(&mut slot.reported_listed, true) {
                self.reported.push(key);
            }
            // The token that ended the gap ended the silence too: the report is the stream's word.
            wake(slot, &mut self.woken);
        }
        self.pending.push_back(Pending {
            key,
            start,
            end,
            phase,
            labels,
        });
        if self.pending.len() > MAX_PENDING {
            self.overflowed += 1;
            let oldest = self.pending.pop_front()?;
            return Some(self.settle_one(oldest));
        }
        None
    }

    /// The beat of stream `key` changed while the sweep counted it silent (its write returned
    /// true): the next sweep reads it again. A hitch's report does the same.
    pub fn woke(&mut self, key: u64) {
        if let Some(slot) = self.streams.get_mut(&key) {
            wake(slot, &mut self.woken);
        }
    }

    /// The sweep at `now`: counts the streams inside a hitch, opens, extends or ends the episode,
    /// and settles the hitches whose scope is now known.
    pub fn sweep(&mut self, now: i64) -> SweepOutcome<L> {
        let mut outcome = SweepOutcome::default();
        let since = self.last_sweep;
        self.last_sweep = now;
        let streams = &self.streams;
        self.silent.compact(|(key, entry)| {
            streams
                .get(&key)
                .is_some_and(|s| s.silent && s.silent_entry == entry)
        });
        let fresh = self.silent.mark();
        self.read_due(now);
        self.read_woken(now);
        let (reported, reported_start, reported_end) = self.read_reported(since);
        let inside = self.silent.len() + reported;
        let past_first = self.past_first;
        let tau = self.settings.rate_window_secs();
        if since > 0 && now > since {
            let seconds = past_first as f64 * (now - since) as f64 * 1e-9;
            self.pool_observed.add(now, seconds, tau);
        }
        let needed = self.settings.min_streams.max(1);
        let share = inside as f64 >= self.settings.min_share * past_first as f64;
        let floors = inside >= needed && share && past_first > 0;
        // An open episode lasts while the floors hold; a new one must also be unlikely by chance.
        let active = floors && (self.open.is_some() || self.rare(now, past_first, inside));
        if active {
            let began = self.open.is_none();
            if began {
                let (silent_start, _) = self.silent_extent(since);
                self.begin(silent_start.min(reported_start));
                outcome.began = true;
            }
            // Streams silent at an earlier sweep of this episode were caught then.
            self.catch(if began { 0 } else { fresh });
        } else if let Some(mut episode) = self.open.take() {
            let (_, silent_end) = self.silent_extent(since);
            let latest_end = silent_end.max(reported_end);
            let end = if latest_end > episode.start {
                latest_end
            } else {
                since
            };
            episode.end = Some(end.max(episode.start));
            if self.episodes.len() == MAX_EPISODES {
                self.episodes.pop_front();
            }
            self.episodes.push_back(episode.clone());
            outcome.ended.push(episode);
        }
        while self
            .pending
            .front()
            .is_some_and(|p| now - p.end >= self.settle)
        {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let settled = self.settle_one(p);
            outcome.settled.push(settled);
        }
        outcome
    }

    /// Whether `inside` of the `past_first` streams inside a hitch at once is too many for
    /// independent stalls (docs/batch.md, "Episodes that would not happen by chance"). Reads
    /// every stream's rate: run only when the floors hold and no episode is open.
    fn rare(&mut self, now: i64, past_first: usize, inside: usize) -> bool {
        let tau = self.settings.rate_window_secs();
        let pooled = chance::pooled(
            self.pool_hitched.at(now, tau),
            self.pool_observed.at(now, tau),
        );
        let lambda: f64 = self
            .streams
            .values()
            .filter(|s| s.past_first)
            .map(|s| {
                let observed = chance::observed(s.start, now, tau);
                chance::share(s.hitched.at(now, tau), observed, pooled)
            })
            .sum();
        let verdict = chance::judge(past_first, inside, lambda, self.settings.false_positive);
        self.last_verdict = Some(verdict);
        verdict.rare
    }

    /// A hitch of stream `key` from `start` to `end` had no episode: it counts toward the stream's
    /// and the upstream's rate of hitches of their own.
    fn count_own(&mut self, key: u64, start: i64, end: i64) {
        let tau = self.settings.rate_window_secs();
        let seconds = (end - start).max(0) as f64 * 1e-9;
        self.pool_hitched.add(end, seconds, tau);
        if let Some(slot) = self.streams.get_mut(&key) {
            slot.hitched.add(end, seconds, tau);
        }
    }

    /// Opens an episode that began at `start`, naming the arrivals of its lookback.
    fn begin(&mut self, start: i64) {
        let from = start.saturating_sub(self.settings.lookback_nanos());
        let window: Vec<&Arrival> = self
            .arrivals
            .iter()
            .filter(|a| a.at >= from && a.at <= start)
            .collect();
        let skip = window.len().saturating_sub(MAX_EPISODE_ARRIVALS);
        let episode = Episode {
            id: self.next_episode,
            start,
            end: None,
            streams: 0,
            stream_ids: Vec::new(),
            first_trace_id: None,
            stream_keys: Vec::new(),
            arrivals: window.len(),
            arrived: window.into_iter().skip(skip).cloned().collect(),
            hitch_phases: [0; 3],
        };
        self.next_episode += 1;
        self.open = Some(episode);
    }

    /// Adds the streams inside a hitch now to the open episode, each once (a stream carries the
    /// number of the last episode that caught it): the silent ones from place `from` of the
    /// silent list on, then those inside by a reported hitch, in that order.
    fn catch(&mut self, from: usize) {
        let Some(episode) = self.open.as_mut() else {
            return;
        };
        let streams = &mut self.streams;
        for &(key, entry) in self.silent.from(from) {
            if let Some(slot) = streams.get_mut(&key) {
                if slot.silent && slot.silent_entry == entry {
                    caught(episode, slot);
                }
            }
        }
        for key in &self.inside {
            if let Some(slot) = streams.get_mut(key) {
                caught(episode, slot);
            }
        }
    }

    /// Reads the beats of the streams whose deadline has come: a stream silent past its
    /// threshold joins the silent list (its beat watched from now on), the others go back into
    /// the heap at their new deadline.
    fn read_due(&mut self, now: i64) {
        while let Some(&Reverse((deadline, key))) = self.due.peek() {
            if deadline > now {
                break;
            }
            self.due.pop();
            let Some(slot) = self.streams.get_mut(&key) else {
                continue; // it ended
            };
            if slot.silent {
                continue;
            }
            self.beat_reads += 1;
            let (last, threshold) = slot.beat.read();
            if last == 0 {
                // Its first token is announced only after its beat holds it; read it again
                // rather than lose it (a stream out of the heap is never counted past its first
                // token, and its hitches would then count inside a co-stall it is not part of).
                self.due
                    .push(Reverse((now.saturating_add(MIN_RECHECK), key)));
                continue;
            }
            if !slot.past_first {
                slot.past_first = true;
                self.past_first += 1;
            }
            match watch_if_silent(slot, now, (last, threshold), &mut self.beat_reads) {
                Ok(since) => {
                    slot.silent = true;
                    slot.silent_since = since;
                    slot.silent_entry = self.silent.enter(key);
                }
                Err(beat) => self.due.push(Reverse((deadline_of(beat, now), key))),
            }
        }
    }

    /// Reads again the beats of the silent streams that told of a write since the last sweep:
    /// one still silent keeps its place (its silence start as read now), the others leave the
    /// list for the heap. Silent streams that told nothing are still silent: no beat is read.
    fn read_woken(&mut self, now: i64) {
        for key in self.woken.drain(..) {
            let Some(slot) = self.streams.get_mut(&key) else {
                continue;
            };
            slot.woken_listed = false;
            if !slot.silent {
                continue;
            }
            self.beat_reads += 1;
            let beat = slot.beat.read();
            match watch_if_silent(slot, now, beat, &mut self.beat_reads) {
                Ok(since) => slot.silent_since = since,
                Err(beat) => {
                    slot.silent = false;
                    self.silent.leave();
                    self.due.push(Reverse((deadline_of(beat, now), key)));
                }
            }
        }
    }

    /// The streams inside a hitch by a hitch reported since the previous sweep and not silent
    /// (into `self.inside`). Returns their count, where the earliest of their hitches began,
    /// and where the latest reported hitch (of any stream, silent or not) ended.
    fn read_reported(&mut self, since: i64) -> (usize, i64, i64) {
        let mut earliest = i64::MAX;
        let mut latest_end = i64::MIN;
        self.inside.clear();
        for key in self.reported.drain(..) {
            let Some(slot) = self.streams.get_mut(&key) else {
                continue;
            };
            slot.reported_listed = false;
            let Some((start, end)) = slot.reported.filter(|(_, end)| *end > since) else {
                continue;
            };
            latest_end = latest_end.max(end);
            if slot.silent {
                continue; // counted among the silent
            }
            // Only streams counted past their first token are judged (`past_first` is the n of
            // the chance rule): never more streams inside than counted.
            if !slot.past_first {
                continue;
            }
            self.inside.push(key);
            earliest = earliest.min(start);
        }
        (self.inside.len(), earliest, latest_end)
    }

    /// Over the silent streams: where the earliest silence (or the hitch reported since the
    /// previous sweep, when earlier) began, and where the latest reported hitch ended. A scan
    /// of the list, run only when an episode begins or ends.
    fn silent_extent(&self, since: i64) -> (i64, i64) {
        let mut earliest = i64::MAX;
        let mut latest_end = i64::MIN;
        for &(key, entry) in self.silent.from(0) {
            let Some(slot) = self.streams.get(&key) else {
                continue;
            };
            if !slot.silent || slot.silent_entry != entry {
                continue;
            }
            let start = match slot.reported.filter(|(_, end)| *end > since) {
                Some((start, end)) => {
                    latest_end = latest_end.max(end);
                    start.min(slot.silent_since)
                }
                None => slot.silent_since,
            };
            earliest = earliest.min(start);
        }
        (earliest, latest_end)
    }

    /// When the sweep next has work (nanoseconds): a stream's deadline, a hitch's settling, or
    /// the next sweep while streams are silent or an episode is open. `None`: nothing is due
    /// (streams waiting for their first token wake the sweep when it comes).
    pub fn next_work(&self, now: i64, sweep: i64) -> Option<i64> {
        if !self.silent.is_empty() || !self.reported.is_empty() || self.open.is_some() {
            return Some(now + sweep);
        }
        let due = self.due.peek().map(|Reverse((at, _))| *at);
        let settle = self.pending.front().map(|p| p.end + self.settle);
        match (due, settle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The scope of one hitch: batch if it overlaps an episode (open or remembered), which then
    /// counts it under its phase. A stream's own hitch counts toward its rate.
    fn settle_one(&mut self, p: Pending<L>) -> Settled<L> {
        let overlaps = |e: &Episode| p.start < e.end.unwrap_or(i64::MAX) && p.end > e.start;
        let episode = self
            .open
            .iter_mut()
            .chain(self.episodes.iter_mut().rev())
            .find(|e| overlaps(e))
            .map(|e| {
                let counted = &mut e.hitch_phases[p.phase.index()];
                *counted = counted.saturating_add(1);
                e.id
            });
        if episode.is_none() {
            self.count_own(p.key, p.start, p.end);
        }
        Settled {
            key: p.key,
            start: p.start,
            end: p.end,
            scope: if episode.is_some() {
                Scope::Batch
            } else {
                Scope::Stream
            },
            episode,
            labels: p.labels,
        }
    }

    /// The episodes remembered and the open one, newest first.
    pub fn episodes(&self) -> impl Iterator<Item = &Episode> {
        self.open.iter().chain(self.episodes.iter().rev())
    }
}

/// Counts a stream inside a hitch in the open `episode`, once.
fn caught(episode: &mut Episode, slot: &mut Slot) {
    if slot.caught == episode.id {
        return;
    }
    slot.caught = episode.id;
    episode.streams += 1;
    if episode.stream_keys.is_empty() {
        episode.first_trace_id = slot.trace_id.clone();
    }
    if episode.stream_keys.len() < MAX_CAUGHT_IDS {
        episode.stream_keys.push(slot.key);
        episode.stream_ids.push(slot.id.clone());
    }
}

/// Puts a silent stream whose beat changed on the list read at the next sweep; its beat is no
/// longer watched until then (the sweep watches it again if it is still silent).
fn wake(slot: &mut Slot, woken: &mut Vec<u64>) {
    if !slot.silent {
        return;
    }
    slot.beat.unwatch();
    if !std::mem::replace(&mut slot.woken_listed, true) {
        woken.push(slot.key);
    }
}

/// Whether a stream whose beat read `(last, threshold)` is silent past its threshold at `now`.
/// If so its beat is watched and read again after the watch (so a write between the two reads
/// is not missed): `Ok` with where its silence began, or `Err` with the beat as last read.
fn watch_if_silent(
    slot: &Slot,
    now: i64,
    (last, threshold): (i64, i64),
    reads: &mut u64,
) -> Result<i64, (i64, i64)> {
    if now - last <= threshold {
        return Err((last, threshold));
    }
    slot.beat.watch();
    *reads += 1;
    let (last, threshold) = slot.beat.read();
    if now - last > threshold {
        Ok(last)
    } else {
        slot.beat.unwatch();
        Err((last, threshold))
    }
}

/// When a stream not silent must be read next: its silence deadline, at most [`MAX_RECHECK`]
/// from `now`.
fn deadline_of((last, threshold): (i64, i64), now: i64) -> i64 {
    last.saturating_add(threshold)
        .saturating_add(1)
        .min(now.saturating_add(MAX_RECHECK))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn settings() -> BatchSettings {
        BatchSettings::default()
    }

    /// A synthetic upstream: `n` streams whose tokens come every `gap`, as one engine's.
    struct Sim {
        tracker: EpisodeTracker<()>,
        beats: Vec<Arc<Beat>>,
        last: Vec<i64>,
        threshold: i64,
    }

    impl Sim {
        fn new(n: usize) -> Self {
            let mut tracker = EpisodeTracker::new(settings(), 5 * MS);
            let mut beats = Vec::new();
            for i in 0..n {
                let beat = Arc::new(Beat::default());
                tracker.start(
                    i as u64,
                    Arc::from(format!("s{i}")),
                    Some(Arc::from(format!("t{i}"))),
                    MS,
                    Some(100),
                    beat.clone(),
                );
                beats.push(beat);
            }
            Sim {
                tracker,
                beats,
                last: vec![0; n],
                threshold: 80 * MS,
            }
        }

        /// Stream `i`'s token at `at`; a gap over the threshold is reported as a hitch, of
        /// phase `Phase::ALL[i % 3]`.
        fn token(&mut self, i: usize, at: i64) {
            let last = self.last[i];
            if last != 0 && at - last >= self.threshold {
                self.tracker
                    .hitch(i as u64, last, at, Phase::ALL[i % 3], ());
            }
            self.last[i] = at;
            if self.beats[i].token(at, self.threshold) {
                self.tracker.woke(i as u64);
            }
            if last == 0 {
                self.tracker.first_token(i as u64, at);
            }
        }

        /// Runs from `from` to `to`: every stream gets a token every 20 ms unless `silent(i, t)`,
        /// with a sweep every 5 ms; returns everything settled and every episode ended.
        fn run(
            &mut self,
            from: i64,
            to: i64,
            silent: impl Fn(usize, i64) -> bool,
        ) -> (Vec<Settled<()>>, Vec<Episode>) {
            let (mut settled, mut ended) = (Vec::new(), Vec::new());
            let mut t = from;
            while t <= to {
                if t % (20 * MS) == 0 {
                    for i in 0..self.beats.len() {
                        if !silent(i, t) {
                            self.token(i, t);
                        }
                    }
                }
                let out = self.tracker.sweep(t);
                settled.extend(out.settled);
                ended.extend(out.ended);
                t += 5 * MS;
            }
            (settled, ended)
        }
    }

    #[test]
    fn a_hitch_of_the_whole_batch_is_one_episode_and_every_hitch_is_batch() {
        let mut sim = Sim::new(10);
        // A long prompt arrives at 395 ms; from 400 to 700 ms no stream gets a token.
        sim.tracker.start(
            99,
            Arc::from("long"),
            Some(Arc::from("t-long")),
            395 * MS,
            Some(40_000),
            Arc::default(),
        );
        let (settled, ended) = sim.run(20 * MS, 1_500 * MS, |_, t| t > 400 * MS && t < 700 * MS);
        assert_eq!(ended.len(), 1);
        let e = &ended[0];
        assert_eq!(e.streams, 10);
        assert_eq!(e.start, 400 * MS);
        assert_eq!(e.end, Some(700 * MS));
        let long = e.arrived.iter().find(|a| a.id.as_ref() == "long").unwrap();
        assert_eq!(long.trace_id.as_deref(), Some("t-long"));
        // The first stream caught, with its request's trace (the counter's exemplar).
        let first = e.stream_ids[0].strip_prefix('s').unwrap();
        assert_eq!(
            e.first_trace_id.as_deref(),
            Some(format!("t{first}").as_str())
        );
        assert_eq!(settled.len(), 10);
        assert!(settled
            .iter()
            .all(|s| s.scope == Scope::Batch && s.episode == Some(1)));
        // Each hitch counted once in the episode, under the phase of the token that ended it
        // (streams 0, 3, 6, 9 reasoning; 1, 4, 7 content; 2, 5, 8 tool_call), once settled.
        assert_eq!(e.hitch_phases, [0; 3], "none settled when it ended");
        let kept: Vec<&Episode> = sim.tracker.episodes().collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].hitch_phases, [4, 3, 3]);
    }

    #[test]
    fn one_streams_stall_is_stream_scope_and_no_episode() {
        let mut sim = Sim::new(10);
        let (settled, ended) = sim.run(20 * MS, 1_500 * MS, |i, t| {
            (i == 3 && t > 400 * MS && t < 700 * MS) || (i == 7 && t > 900 * MS && t < 1_100 * MS)
        });
        assert!(ended.is_empty());
        assert_eq!(settled.len(), 2);
        assert!(settled.iter().all(|s| s.scope == Scope::Stream));
    }

    #[test]
    fn two_of_twenty_at_once_are_too_few_a_share() {
        let mut sim = Sim::new(20);
        let (settled, ended) = sim.run(20 * MS, 1_000 * MS, |i, t| {
            i < 2 && t > 400 * MS && t < 700 * MS
        });
        assert!(ended.is_empty());
        assert_eq!(settled.len(), 2);
        assert!(settled.iter().all(|s| s.scope == Scope::Stream));
    }

    #[test]
    fn the_episode_is_seen_while_it_lasts() {
        let mut sim = Sim::new(4);
        sim.run(20 * MS, 400 * MS, |_, _| false);
        let out = sim.run(405 * MS, 600 * MS, |_, _| true);
        assert!(out.1.is_empty());
        let open = sim.tracker.episodes().next().unwrap();
        assert_eq!((open.end, open.streams), (None, 4));
    }

    #[test]
    fn prompt_tokens_reach_the_episode_after_the_stream_ends() {
        let mut sim = Sim::new(4);
        sim.tracker
            .start(50, Arc::from("long"), None, 390 * MS, None, Arc::default());
        sim.run(20 * MS, 1_000 * MS, |_, t| t > 400 * MS && t < 600 * MS);
        sim.tracker.end(50, Some(12_000));
        let e = sim.tracker.episodes().next().unwrap();
        let long = e.arrived.iter().find(|a| a.key == 50).unwrap();
        assert_eq!(long.prompt_tokens, Some(12_000));
        // Streams that end leave no slot behind.
        for i in 0..4 {
            sim.tracker.end(i, None);
        }
        assert_eq!(sim.tracker.active(), 0);
        assert!(sim.tracker.idle());
    }

    #[test]
    fn rings_stay_bounded_whatever_the_history() {
        let mut sim = Sim::new(4);
        for i in 0..(MAX_ARRIVALS as u64 + 10) {
            sim.tracker.start(
                1_000 + i,
                Arc::from("burst"),
                None,
                2 * MS,
                None,
                Arc::default(),
            );
            sim.tracker.end(1_000 + i, Some(1));
        }
        // A whole-batch stall every 400 ms, 100 times: 100 episodes.
        let (_, ended) = sim.run(20 * MS, 40_100 * MS, |_, t| t % (400 * MS) > 200 * MS);
        assert_eq!(ended.len(), 100);
        assert_eq!(sim.tracker.episodes().count(), MAX_EPISODES);
        assert_eq!(sim.tracker.arrivals.len(), MAX_ARRIVALS);
        assert!(sim.tracker.pending.len() <= 4 * 2, "settled as they go");
    }

    /// Consecutive keys land in distinct low bits (the table's index) and vary the top seven
    /// (hashbrown's control byte).
    #[test]
    fn consecutive_keys_spread_over_the_table() {
        let hash = |k: u64| {
            let mut h = KeyHasher::default();
            h.write_u64(k);
            h.finish()
        };
        let low: std::collections::HashSet<u64> = (0..1024).map(|k| hash(k) & 1023).collect();
        assert_eq!(low.len(), 1024);
        let top: std::collections::HashSet<u64> = (0..1024).map(|k| hash(k) >> 57).collect();
        assert_eq!(top.len(), 128);
    }

    /// Streams waiting for their first token have no deadline: the sweep reads none of them and
    /// has nothing due, until a first token puts that stream (and only it) in the heap.
    #[test]
    fn streams_without_a_first_token_cost_the_sweep_nothing() {
        let mut tracker = EpisodeTracker::<()>::new(settings(), 5 * MS);
        let beats: Vec<Arc<Beat>> = (0..1_000).map(|_| Arc::new(Beat::default())).collect();
        for (i, beat) in beats.iter().enumerate() {
            tracker.start(i as u64, Arc::from("s"), None, MS, None, beat.clone());
        }
        for t in 1..100 {
            let out = tracker.sweep(t * 10 * MS);
            assert!(out.settled.is_empty() && out.ended.is_empty());
            assert!(
                tracker.due.is_empty(),
                "no stream is due before its first token"
            );
            assert_eq!(tracker.next_work(t * 10 * MS, 5 * MS), None);
        }
        assert_eq!(tracker.past_first, 0);
        assert!(
            !beats[7].token(1_000 * MS, 80 * MS),
            "not watched before it is due"
        );
        tracker.first_token(7, 1_000 * MS);
        assert_eq!(tracker.due.len(), 1);
        tracker.sweep(1_001 * MS);
        assert_eq!(tracker.past_first, 1);
        // Back in the heap at its silence deadline, and nothing else is.
        assert_eq!(tracker.due.len(), 1);
        assert_eq!(tracker.next_work(1_001 * MS, 5 * MS), Some(1_080 * MS + 1));
    }

    #[test]
    fn five_thousand_silent_streams_are_one_episode_of_five_thousand() {
        const N: usize = 5_000;
        let mut sim = Sim::new(N);
        sim.run(20 * MS, 400 * MS, |_, _| false);
        // Every stream falls silent for a second: one episode, each stream counted once
        // however many sweeps it stays silent.
        let (settled, ended) = sim.run(405 * MS, 1_400 * MS, |_, t| t < 1_300 * MS);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].streams, N);
        assert_eq!(ended[0].stream_ids.len(), MAX_CAUGHT_IDS);
        // Past the pending bound the oldest hitches were settled as they came (batch too).
        assert_eq!(settled.len() as u64 + sim.tracker.overflowed, N as u64);
        assert!(settled.iter().all(|s| s.scope == Scope::Batch));
        // A sweep with nothing due reads no beat: the heap's next deadline is in the future.
        let next = sim.tracker.next_work(1_400 * MS, 5 * MS).unwrap();
        assert!(next > 1_400 * MS);
    }

    #[test]
    fn a_sweep_reads_only_the_streams_that_are_due() {
        let mut sim = Sim::new(100);
        sim.run(20 * MS, 400 * MS, |_, _| false);
        // All streams steady: the heap holds one entry per stream, none due yet (an entry may
        // be older than the stream's last token: it is read again and pushed on when it pops).
        let next = sim.tracker.next_work(401 * MS, 5 * MS).unwrap();
        assert!(next > 401 * MS, "{next}");
        assert_eq!(sim.tracker.due.len(), 100);
        assert!(sim.tracker.silent.is_empty());
    }

    /// `n` streams of one upstream in model time, each stalling on its own: a token every 30 ms
    /// ±30 %, and before each token a 300 ms stall with chance 1 %, seeded; swept every 10 ms.
    /// Returns the episodes that ended.
    fn independent_stalls(n: usize, seconds: i64, seed: u64, settings: BatchSettings) -> usize {
        let mut tracker: EpisodeTracker<()> = EpisodeTracker::new(settings, 10 * MS);
        let mut x = seed | 1;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let threshold = 120 * MS;
        let mut beats = Vec::new();
        let mut last = vec![0i64; n];
        let mut next = Vec::new();
        for i in 0..n {
            let beat = Arc::new(Beat::default());
            tracker.start(i as u64, Arc::from("s"), None, 0, None, beat.clone());
            beats.push(beat);
            next.push((rand() * 30.0) as i64 * MS + MS);
        }
        let mut ended = 0;
        let mut t = 0;
        while t <= seconds * 1_000 * MS {
            for i in 0..n {
                while next[i] <= t {
                    let at = next[i];
                    if last[i] != 0 && at - last[i] >= threshold {
                        tracker.hitch(i as u64, last[i], at, Phase::Content, ());
                    }
                    if last[i] == 0 {
                        tracker.first_token(i as u64, at);
                    }
                    last[i] = at;
                    if beats[i].token(at, threshold) {
                        tracker.woke(i as u64);
                    }
                    let mut gap = (30.0 * (0.7 + 0.6 * rand()) * MS as f64) as i64;
                    if rand() < 0.01 {
                        gap += 300 * MS;
                    }
                    next[i] = at + gap;
                }
            }
            ended += tracker.sweep(t).ended.len();
            t += 10 * MS;
        }
        ended
    }

    #[test]
    fn independent_stalls_make_no_episode_at_2_4_12_and_64_streams() {
        let runs = [(2, 600), (4, 600), (12, 600), (64, 120)];
        for (n, seconds) in runs {
            let episodes = independent_stalls(n, seconds, 0x5EED + n as u64, settings());
            assert_eq!(episodes, 0, "{n} streams for {seconds} s");
        }
        // The same stalls with only the floors and k ≥ λ + 1 (any tail allowed): co-stalls
        // happen, so the run above is a test of the tail bound.
        let loose = BatchSettings {
            false_positive: 1.0,
            ..settings()
        };
        let episodes = independent_stalls(4, 120, 0x5EED + 4, loose);
        assert!(episodes > 0, "{episodes}");
    }

    /// Property: with one stream stalling at a time, among any number of streams, nothing is
    /// ever an episode or a batch hitch; with every stream stalling at once, every hitch is.
    #[test]
    fn property_lone_stalls_never_batch_common_ones_always() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..30 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Four or more: three fresh streams all at once is 8e-6 by chance (docs/batch.md).
            let n = 4 + (x % 30) as usize;
            let who = (x >> 20) as usize % n;
            let from = (10 + (x >> 30) % 20) as i64 * 20 * MS;
            let len = (5 + (x >> 40) % 20) as i64 * 20 * MS;
            let mut sim = Sim::new(n);
            let (settled, ended) = sim.run(20 * MS, 2_000 * MS, |i, t| {
                i == who && t > from && t < from + len
            });
            assert!(ended.is_empty(), "round {round}");
            assert!(settled.iter().all(|s| s.scope == Scope::Stream));
            let mut sim = Sim::new(n);
            let (settled, ended) = sim.run(20 * MS, 2_000 * MS, |_, t| t > from && t < from + len);
            assert_eq!(ended.len(), 1, "round {round}");
            assert_eq!(settled.len(), n);
            assert!(settled.iter().all(|s| s.scope == Scope::Batch));
        }
    }

    /// Silent streams cost the sweep nothing until one writes its beat: 1,000 streams silent
    /// for a second are read once each when they fall silent and not again (polling read each
    /// at every sweep: 100,000 reads); a write is told and read at the next sweep, once.
    #[test]
    fn silent_streams_are_not_read_again_until_their_beat_changes() {
        const N: usize = 1_000;
        let mut sim = Sim::new(N);
        sim.run(20 * MS, 400 * MS, |_, _| false);
        // Every stream silent from 400 ms: each is read when its deadline comes (480 ms) and
        // once more after its watch.
        sim.run(405 * MS, 500 * MS, |_, _| true);
        assert_eq!(sim.tracker.silent.len(), N);
        let before = sim.tracker.beat_reads;
        sim.run(505 * MS, 1_500 * MS, |_, _| true);
        assert_eq!(
            sim.tracker.beat_reads, before,
            "200 sweeps of 1,000 silent streams"
        );
        assert_eq!(sim.tracker.silent.len(), N);
        // One stream's token: told by its hitch's report, read once at the next sweep, and
        // back in the heap; the others are still not read.
        sim.token(7, 1_503 * MS);
        sim.tracker.sweep(1_505 * MS);
        assert_eq!(sim.tracker.beat_reads, before + 1);
        assert_eq!(sim.tracker.silent.len(), N - 1);
        assert!(!sim.tracker.streams[&7].silent);
        // A write that is not a hitch (a stop beginning) is told too.
        assert!(sim.beats[8].hold(), "a silent stream's beat is watched");
        sim.tracker.woke(8);
        sim.tracker.sweep(1_510 * MS);
        assert_eq!(sim.tracker.beat_reads, before + 2);
        assert_eq!(sim.tracker.silent.len(), N - 2);
    }

    /// At one token a second (every stream silent 80 % of the time, past the 200 ms stall
    /// threshold) the sweep's reads follow the token events, not the silent streams times the
    /// sweeps: at most three per token event (its deadline, the read after the watch, the read
    /// after its silence ended). Polling read about 800 streams at each of 1,000 sweeps.
    #[test]
    fn at_one_token_a_second_beat_reads_follow_the_token_events() {
        const N: usize = 1_000;
        let mut tracker: EpisodeTracker<()> = EpisodeTracker::new(settings(), 10 * MS);
        let threshold = 200 * MS;
        let beats: Vec<Arc<Beat>> = (0..N).map(|_| Arc::new(Beat::default())).collect();
        let mut last = vec![0i64; N];
        for (i, beat) in beats.iter().enumerate() {
            tracker.start(i as u64, Arc::from("s"), None, 0, None, beat.clone());
        }
        let mut events = 0u64;
        let mut t = 0;
        while t <= 10_000 * MS {
            for i in 0..N {
                // Stream i's tokens come at i ms past each second.
                if t % (1_000 * MS) == (i as i64 % 100) * 10 * MS {
                    if last[i] != 0 && t - last[i] > threshold {
                        tracker.hitch(i as u64, last[i], t, Phase::Content, ());
                    }
                    if beats[i].token(t, threshold) {
                        tracker.woke(i as u64);
                    }
                    if last[i] == 0 {
                        tracker.first_token(i as u64, t);
                    }
                    last[i] = t;
                    events += 1;
                }
            }
            tracker.sweep(t);
            t += 10 * MS;
        }
        // Ten seconds of every stream, and the tenth of them whose slot is the 10 s mark.
        assert_eq!(events, 10 * N as u64 + N as u64 / 100);
        assert!(
            tracker.beat_reads <= 3 * events,
            "{} reads for {events} token events",
            tracker.beat_reads
        );
        assert!(
            tracker.silent.len() > N / 2,
            "most are silent at any moment"
        );
    }

    /// One step of [`property_the_silent_list_follows_the_beats`]'s schedules: what stream
    /// `i` does.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// A token event `ms` after now's clock moved on by `ms`.
        Token,
        /// A token event whose frame was read before the last sweep (stored after it).
        Late,
        /// A stop begins (the beat's threshold goes to infinity).
        Hold,
        /// The stop ends: the silence counts from now.
        Release,
        /// A token event after a stop, not judged.
        Resume,
        /// Its threshold changes at its next token event (the ratio rule's threshold moving).
        Threshold,
        /// The stream ends and another begins.
        Restart,
        /// The sweep runs.
        Sweep,
    }

    /// The side of a stream the tracker sees, as [`super::super::live::StreamProbe`] drives it.
    struct Side {
        key: u64,
        beat: Arc<Beat>,
        last: i64,
        threshold: i64,
        next_threshold: i64,
    }

    impl Side {
        fn token(&mut self, tracker: &mut EpisodeTracker<()>, at: i64, judged: bool) {
            let at = at.max(1);
            if judged && self.last != 0 && at - self.last > self.threshold {
                tracker.hitch(self.key, self.last, at, Phase::Content, ());
            }
            let first = self.last == 0;
            self.last = self.last.max(at);
            self.threshold = self.next_threshold;
            if self.beat.token(self.last, self.threshold) {
                tracker.woke(self.key);
            }
            if first {
                tracker.first_token(self.key, at);
            }
        }
    }

    /// Checks the incremental bookkeeping after a sweep at `now` (the previous at `since`)
    /// against a recount from every beat, as polling every silent stream found it: each stream
    /// counted silent is silent by its beat now, with its silence start as the beat says, and
    /// its beat watched; the list's live entries are exactly the silent streams, each once;
    /// every other stream past its first token is in the heap (read again later, never lost);
    /// and the earliest silence start is the one the beats give.
    fn check_against_a_recount(tracker: &EpisodeTracker<()>, now: i64, since: i64) {
        let mut listed = Vec::new();
        for &(key, entry) in tracker.silent.from(0) {
            if let Some(slot) = tracker.streams.get(&key) {
                if slot.silent && slot.silent_entry == entry {
                    listed.push(key);
                }
            }
        }
        let mut recounted: Vec<u64> = Vec::new();
        let mut earliest = i64::MAX;
        for slot in tracker.streams.values() {
            let (last, threshold) = slot.beat.read();
            assert_eq!(slot.beat.watched.load(Ordering::Relaxed), slot.silent);
            if slot.silent {
                assert!(
                    now - last > threshold,
                    "counted silent but its beat says not"
                );
                assert_eq!(slot.silent_since, last);
                recounted.push(slot.key);
                let start = match slot.reported.filter(|(_, end)| *end > since) {
                    Some((start, _)) => start.min(last),
                    None => last,
                };
                earliest = earliest.min(start);
            } else if last != 0 {
                let queued = tracker.due.iter().any(|Reverse((_, k))| *k == slot.key);
                assert!(queued, "stream {} is neither silent nor due", slot.key);
            }
        }
        assert_eq!(tracker.silent.len(), recounted.len());
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), listed.len(), "a stream listed twice");
        recounted.sort_unstable();
        assert_eq!(sorted, recounted);
        assert_eq!(tracker.silent_extent(since).0, earliest);
    }

    proptest::proptest! {
        /// Property: over random schedules of token events (on time and late), stops, resumes,
        /// threshold changes, ends and sweeps of six streams, the streams counted silent are
        /// always those whose beats say so ([`check_against_a_recount`]).
        #[test]
        fn property_the_silent_list_follows_the_beats(
            steps in proptest::collection::vec((0usize..6, 0u8..9, 0i64..120), 1..600),
        ) {
            let mut tracker: EpisodeTracker<()> = EpisodeTracker::new(settings(), 5 * MS);
            let mut sides: Vec<Side> = Vec::new();
            let mut next_key = 0u64;
            let mut open = |tracker: &mut EpisodeTracker<()>, at: i64| {
                next_key += 1;
                let beat = Arc::new(Beat::default());
                tracker.start(next_key, Arc::from("s"), None, at, None, beat.clone());
                Side { key: next_key, beat, last: 0, threshold: 40 * MS, next_threshold: 40 * MS }
            };
            for _ in 0..6 {
                sides.push(open(&mut tracker, 1));
            }
            let (mut now, mut swept) = (MS, 0);
            for (i, kind, ms) in steps {
                let step = [
                    Step::Token, Step::Token, Step::Late, Step::Hold, Step::Release,
                    Step::Resume, Step::Threshold, Step::Restart, Step::Sweep,
                ][kind as usize];
                now += ms * MS / 4;
                let side = &mut sides[i];
                match step {
                    Step::Token => side.token(&mut tracker, now, true),
                    Step::Late => {
                        let at = (swept - ms * MS / 4).max(side.last);
                        side.token(&mut tracker, at, true);
                    }
                    Step::Hold => {
                        if side.beat.hold() {
                            tracker.woke(side.key);
                        }
                    }
                    Step::Release => {
                        if side.last != 0 && side.beat.token(now, side.threshold) {
                            tracker.woke(side.key);
                        }
                    }
                    Step::Resume => side.token(&mut tracker, now, false),
                    Step::Threshold => side.next_threshold = (ms + 5) * MS,
                    Step::Restart => {
                        tracker.end(side.key, None);
                        *side = open(&mut tracker, now);
                    }
                    Step::Sweep => {
                        let since = tracker.last_sweep;
                        tracker.sweep(now);
                        check_against_a_recount(&tracker, now, since);
                        swept = now;
                    }
                }
            }
        }
    }
}
