//! `--engine batch`: one decode loop for the whole server, as a continuous-batching engine
//! (vLLM, SGLang, TGI) runs it, so a test can cause the hitch that hits every stream at once.
//!
//! Each step emits one token to every stream that is decoding and takes `--gap`; a request that
//! arrives waits for the next step, whose prefill of its prompt holds that step for
//! `prompt tokens × --prefill-per-token` (at most `--prefill-chunk` prompt tokens a step, as
//! chunked prefill does). A request's first token comes at the end of the step that finishes its
//! prefill. The loop is not a task of its own: it is advanced, under one lock, to the moment
//! whoever asks (a stream waking at a step's end, a request arriving), and the content of a step
//! is fixed when the step starts, from the requests that had arrived by then.

use crate::poison::LockExt;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Steps whose cumulative prefill hold is remembered, for the ground truth of a gap.
const HOLD_HISTORY: u64 = 1 << 14;

/// The knobs of the engine, from `--gap`, `--prefill-per-token` and `--prefill-chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSettings {
    /// A step's time without prefill.
    pub gap: Duration,
    /// What each prompt token prefilled in a step adds to it.
    pub prefill_per_token: Duration,
    /// Most prompt tokens prefilled in one step (0: no limit).
    pub prefill_chunk: u64,
    /// Keep what each step prefilled for the timeline (only when one is written).
    pub keep_chunks: bool,
}

/// The shared decode loop of one sim server.
#[derive(Debug)]
pub(crate) struct BatchEngine {
    settings: EngineSettings,
    state: Mutex<EngineState>,
}

/// One request's prefill, waiting or under way.
#[derive(Debug, Clone, Copy)]
struct Prefill {
    seq: u64,
    arrived: Instant,
    left: u64,
}

/// What a step prefilled, for the timeline: the stream, its tokens, and the step's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillChunk {
    /// The stream's sequence number.
    pub seq: u64,
    /// The step (0-based).
    pub step: u64,
    /// Prompt tokens of this stream prefilled in the step.
    pub tokens: u64,
    /// The step's whole prefill hold.
    pub step_hold: Duration,
}

#[derive(Debug)]
struct EngineState {
    /// The step in progress (when `running`), else the next to start; also the steps finished.
    step: u64,
    step_end: Instant,
    running: bool,
    /// Streams past their prefill that still decode.
    decoding: u64,
    queue: VecDeque<Prefill>,
    /// Streams whose prefill ends with the step in progress (their first token comes at its end).
    finishing: Vec<u64>,
    /// The step each stream's first token comes at the end of, until the stream takes it.
    first_step: HashMap<u64, u64>,
    /// Prefill hold summed over steps `0..=i`, at `i % HOLD_HISTORY`.
    hold_sum: Vec<Duration>,
    /// What steps prefilled, until the streams' timelines take it.
    chunks: Vec<PrefillChunk>,
}

/// Where the loop is at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clock {
    /// Steps finished so far (so the step in progress has this index).
    pub finished: u64,
    /// When the step in progress ends; `None` while the loop is idle.
    pub next_end: Option<Instant>,
}

// === impl BatchEngine ===

impl BatchEngine {
    /// An idle engine.
    pub(crate) fn new(settings: EngineSettings, now: Instant) -> Arc<Self> {
        Arc::new(BatchEngine {
            settings,
            state: Mutex::new(EngineState {
                step: 0,
                step_end: now,
                running: false,
                decoding: 0,
                queue: VecDeque::new(),
                finishing: Vec::new(),
                first_step: HashMap::new(),
                hold_sum: Vec::new(),
                chunks: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.state.lock_or_recover()
    }

    /// Request `seq` arrived at `now` with `prompt_tokens` to prefill.
    pub(crate) fn join(&self, seq: u64, prompt_tokens: u64, now: Instant) {
        let mut state = self.lock();
        self.advance(&mut state, now);
        state.queue.push_back(Prefill {
            seq,
            arrived: now,
            left: prompt_tokens.max(1),
        });
        self.advance(&mut state, now);
    }

    /// The loop advanced to `now`.
    pub(crate) fn clock(&self, now: Instant) -> Clock {
        let mut state = self.lock();
        self.advance(&mut state, now);
        Clock {
            finished: state.step,
            next_end: state.running.then_some(state.step_end),
        }
    }

    /// The step whose end brings stream `seq` its first token, once that step has started;
    /// the stream then decodes (it is counted until [`Self::leave`]).
    pub(crate) fn take_first_step(&self, seq: u64) -> Option<u64> {
        let mut state = self.lock();
        let step = state.first_step.remove(&seq)?;
        state.decoding += 1;
        Some(step)
    }

    /// Stream `seq` stops: it decodes no more (`decoding`), or leaves before its prefill ended.
    pub(crate) fn leave(&self, seq: u64, decoding: bool) {
        let mut state = self.lock();
        if decoding {
            state.decoding = state.decoding.saturating_sub(1);
        } else {
            state.queue.retain(|p| p.seq != seq);
            state.finishing.retain(|s| *s != seq);
            state.first_step.remove(&seq);
        }
    }

    /// Prefill hold of steps `after + 1 ..= upto`: the batch's share of a gap between the tokens
    /// of those two steps.
    pub(crate) fn hold_between(&self, after: u64, upto: u64) -> Duration {
        let state = self.lock();
        let at = |i: u64| {
            state
                .hold_sum
                .get((i % HOLD_HISTORY) as usize)
                .copied()
                .unwrap_or_default()
        };
        if upto <= after || upto - after >= HOLD_HISTORY {
            return Duration::ZERO;
        }
        at(upto).saturating_sub(at(after))
    }

    /// What steps prefilled since the last call (for the timeline).
    pub(crate) fn take_chunks(&self) -> Vec<PrefillChunk> {
        std::mem::take(&mut self.lock().chunks)
    }

    /// Runs the loop's steps up to `now`: ends each step due, starts the next one if there is
    /// work, and with none goes idle until the next arrival.
    fn advance(&self, state: &mut EngineState, now: Instant) {
        loop {
            if state.running {
                if state.step_end > now {
                    return;
                }
                let step = state.step;
                for seq in std::mem::take(&mut state.finishing) {
                    state.first_step.insert(seq, step);
                }
                state.step += 1;
                state.running = false;
                let decoding = state.decoding > 0 || !state.first_step.is_empty();
                let at = state.step_end;
                if decoding || state.queue.front().is_some_and(|p| p.arrived <= at) {
                    self.start_step(state, at);
                }
                continue;
            }
            match state.queue.front() {
                Some(first) if first.arrived <= now => {
                    let at = first.arrived.max(state.step_end);
                    self.start_step(state, at);
                }
                _ => return,
            }
        }
    }

    /// Starts a step at `at`: takes the prefill that fits in it from the requests that had
    /// arrived by then, and fixes its end.
    fn start_step(&self, state: &mut EngineState, at: Instant) {
        let mut budget = match self.settings.prefill_chunk {
            0 => u64::MAX,
            n => n,
        };
        let mut prefilled = 0u64;
        let mut taken: Vec<(u64, u64)> = Vec::new();
        while budget > 0 {
            let Some(front) = state.queue.front_mut().filter(|p| p.arrived <= at) else {
                break;
            };
            let tokens = front.left.min(budget);
            front.left -= tokens;
            budget -= tokens;
            prefilled += tokens;
            taken.push((front.seq, tokens));
            if front.left == 0 {
                let seq = front.seq;
                state.queue.pop_front();
                state.finishing.push(seq);
            }
        }
        let hold = mul(self.settings.prefill_per_token, prefilled);
        let step = state.step;
        let before = match step {
            0 => Duration::ZERO,
            i => state
                .hold_sum
                .get(((i - 1) % HOLD_HISTORY) as usize)
                .copied()
                .unwrap_or_default(),
        };
        let slot = (step % HOLD_HISTORY) as usize;
        if state.hold_sum.len() <= slot {
            state.hold_sum.resize(slot + 1, Duration::ZERO);
        }
        state.hold_sum[slot] = before + hold;
        for (seq, tokens) in taken.into_iter().filter(|_| self.settings.keep_chunks) {
            state.chunks.push(PrefillChunk {
                seq,
                step,
                tokens,
                step_hold: hold,
            });
        }
        state.running = true;
        state.step_end = at + self.settings.gap + hold;
    }
}

/// One stream's place in the loop: which step brings its next token, and its own stall.
#[derive(Debug)]
pub(crate) struct BatchSeat {
    engine: Arc<BatchEngine>,
    seq: u64,
    /// The step whose end brings the next token, once the prefill's step is known.
    next_step: Option<u64>,
    /// The step the previous token came with.
    last_step: Option<u64>,
    /// The next token, planned, and the stream's stall before it.
    planned: Option<(super::cadence::Step, Duration)>,
    /// A stall runs until then: the next token comes with the first step to end after it.
    stall_until: Option<Instant>,
    /// Counted among the loop's decoding streams.
    decoding: bool,
}

/// What a wake of a seated stream found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeatWake {
    /// A token is due: the step planned, the batch's hold and the stream's stall in its gap.
    Token {
        /// The token, as the cadence planned it.
        step: super::cadence::Step,
        /// The other requests' prefill in the gap before it.
        held: Duration,
        /// The stream's own stall before it.
        stalled: Duration,
    },
    /// Nothing is due before this moment (`None`: the loop is idle, ask again after a gap).
    Wait(Option<Instant>),
    /// Every token was given.
    Done,
}

// === impl BatchSeat ===

impl BatchSeat {
    /// Seats stream `seq`, whose prompt of `prompt_tokens` arrived at `now` and whose first token
    /// is `first` (with its stall) as the cadence planned it. A stall or a think pause before a
    /// token keeps the stream out of the loop's steps until it is over.
    pub(crate) fn join(
        engine: Arc<BatchEngine>,
        seq: u64,
        prompt_tokens: u64,
        now: Instant,
        first: Option<(super::cadence::Step, Duration)>,
    ) -> Self {
        engine.join(seq, prompt_tokens, now);
        let stall_until = sits_out(first).map(|wait| now + wait);
        BatchSeat {
            engine,
            seq,
            next_step: None,
            last_step: None,
            planned: first,
            stall_until,
            decoding: false,
        }
    }

    /// What is due at `now`. After a `Token`, the caller plans the next one with [`Self::plan`].
    pub(crate) fn wake(&mut self, now: Instant) -> SeatWake {
        let clock = self.engine.clock(now);
        let Some((step, stalled)) = self.planned else {
            return SeatWake::Done;
        };
        let next_step = match self.next_step {
            Some(next) => next,
            None => match self.engine.take_first_step(self.seq) {
                Some(first) => {
                    self.decoding = true;
                    first
                }
                None => return SeatWake::Wait(clock.next_end),
            },
        };
        let mut next_step = next_step;
        if let Some(until) = self.stall_until {
            if now < until {
                self.next_step = Some(next_step);
                return SeatWake::Wait(Some(until));
            }
            // The stall is over: the stream rejoins the step in progress.
            self.stall_until = None;
            next_step = next_step.max(clock.finished);
        }
        self.next_step = Some(next_step);
        if next_step >= clock.finished {
            return SeatWake::Wait(clock.next_end);
        }
        let held = match self.last_step {
            Some(last) => self.engine.hold_between(last, next_step),
            None => Duration::ZERO,
        };
        self.last_step = Some(next_step);
        self.next_step = Some(next_step + 1);
        self.planned = None;
        SeatWake::Token {
            step,
            held,
            stalled,
        }
    }

    /// The token after the one just given, planned at `now`; `None` ends the stream's decoding.
    pub(crate) fn plan(&mut self, next: Option<(super::cadence::Step, Duration)>, now: Instant) {
        self.stall_until = sits_out(next).map(|wait| now + wait);
        self.planned = next;
        if next.is_none() {
            self.leave();
        }
    }

    /// What steps prefilled since the last call, for the timeline.
    pub(crate) fn take_chunks(&self) -> Vec<PrefillChunk> {
        self.engine.take_chunks()
    }

    fn leave(&mut self) {
        self.engine.leave(self.seq, self.decoding);
        self.decoding = false;
        self.planned = None;
        self.next_step = Some(u64::MAX);
    }
}

impl Drop for BatchSeat {
    fn drop(&mut self) {
        if self.next_step != Some(u64::MAX) {
            self.engine.leave(self.seq, self.decoding);
        }
    }
}

/// How long a stream sits out the loop's steps before its planned token: its own stall and the
/// think pause before the token; `None` when it does not.
fn sits_out(planned: Option<(super::cadence::Step, Duration)>) -> Option<Duration> {
    planned
        .map(|(step, stall)| stall + step.pause)
        .filter(|wait| !wait.is_zero())
}

/// `d × n`, saturating.
fn mul(d: Duration, n: u64) -> Duration {
    d.checked_mul(u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::units::ms;

    fn engine(chunk: u64) -> (Arc<BatchEngine>, Instant) {
        let t0 = Instant::now();
        let settings = EngineSettings {
            gap: ms(10),
            prefill_per_token: Duration::from_micros(100),
            prefill_chunk: chunk,
            keep_chunks: true,
        };
        (BatchEngine::new(settings, t0), t0)
    }

    #[test]
    fn an_idle_loop_starts_at_the_arrival_and_steps_every_gap() {
        let (e, t0) = engine(0);
        assert_eq!(e.clock(t0 + ms(5)).next_end, None);
        e.join(1, 100, t0 + ms(5));
        // 100 tokens × 100 µs = 10 ms of prefill on top of the 10 ms step.
        let c = e.clock(t0 + ms(5));
        assert_eq!((c.finished, c.next_end), (0, Some(t0 + ms(25))));
        assert_eq!(e.take_first_step(1), None, "not before its step ended");
        let c = e.clock(t0 + ms(25));
        assert_eq!((c.finished, c.next_end), (1, Some(t0 + ms(35))));
        assert_eq!(e.take_first_step(1), Some(0));
        assert_eq!(e.clock(t0 + ms(100)).finished, 8);
        assert_eq!(e.hold_between(0, 7), ms(0));
        e.leave(1, true);
        // Nothing decodes: the loop stops after the step in progress.
        assert_eq!(e.clock(t0 + ms(1000)).next_end, None);
    }

    #[test]
    fn a_long_prompt_holds_the_step_after_it_arrives() {
        let (e, t0) = engine(0);
        e.join(1, 1, t0);
        assert_eq!(e.clock(t0 + ms(11)).finished, 1);
        assert_eq!(e.take_first_step(1), Some(0));
        // Arrives during step 1 (10.1..20.1 ms): step 2 prefills its 2,000 tokens (200 ms).
        e.join(2, 2000, t0 + ms(15));
        let c = e.clock(t0 + ms(21));
        assert_eq!(c.finished, 2);
        let end = c.next_end.unwrap();
        assert_eq!(end - (t0 + Duration::from_micros(20_100)), ms(210));
        assert_eq!(e.hold_between(1, 2), ms(200));
        assert_eq!(e.hold_between(2, 3), ms(0));
        let chunks = e.take_chunks();
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            (chunks[1].seq, chunks[1].step, chunks[1].tokens),
            (2, 2, 2000)
        );
    }

    #[test]
    fn chunked_prefill_spreads_the_hold_over_steps() {
        let (e, t0) = engine(500);
        e.join(1, 1, t0);
        e.clock(t0 + ms(11));
        e.take_first_step(1);
        e.join(2, 1200, t0 + ms(12));
        // Steps 2, 3, 4 prefill 500, 500 and 200 tokens.
        let c = e.clock(t0 + ms(300));
        assert!(c.finished >= 5, "{c:?}");
        assert_eq!(e.hold_between(1, 2), ms(50));
        assert_eq!(e.hold_between(2, 3), ms(50));
        assert_eq!(e.hold_between(3, 4), ms(20));
        assert_eq!(e.take_first_step(2), Some(4));
    }
}
