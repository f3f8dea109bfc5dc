//! When each decode step of a stream happens and how many tokens it yields.
//!
//! A step never crosses a boundary of the stream's [`Output`] (reasoning to answer, answer to tool
//! call, one tool call to the next), so each step has one phase; the first answer step after a
//! reasoning phase comes a think pause later than its gap.
//!
//! Every time is an offset from the moment the request arrived, planned by adding step times, so
//! the stream can sleep until absolute deadlines and timer lateness never accumulates. Each
//! stream draws from its own RNG, seeded from the global seed and the stream's sequence number:
//! the same seed and the same arrival order give the same gaps, stalls and accepted tokens.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::config::SimConfig;
use super::phases::{Output, Phase};

/// Spreads sequence numbers over the seed space (the golden-ratio constant of splitmix64).
const STREAM_SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

/// One decode step: a token event on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Planned send time, from the request's arrival.
    pub offset: Duration,
    /// Index (0-based) of the step's first token in the stream's output.
    pub first_token: u64,
    /// Tokens the step yields: 1, or more under speculative decoding.
    pub tokens: u32,
    /// The step's number (1-based), as `--stall-at` counts token events.
    pub event: u64,
    /// The phase of the step's tokens.
    pub phase: Phase,
    /// The think pause before the step (zero but for the first step after the reasoning).
    pub pause: Duration,
}

/// The cadence state of one stream.
#[derive(Debug)]
pub(crate) struct StreamCadence {
    /// This stream's own random source: no lock or shared state between streams.
    rng: SmallRng,
    /// Time to first token, prompt cost included.
    ttft: Duration,
    /// Offset of the previous step.
    offset: Duration,
    /// Steps planned so far.
    events: u64,
    /// Tokens planned so far.
    tokens_done: u64,
    /// What the stream outputs, phase by phase.
    output: Output,
    /// The pause between the last reasoning token and the first answer token.
    think_pause: Duration,
    /// A stall before this token event of this stream only (the request's `sim_stall_at`).
    own_stall_at: Option<u64>,
}

// === impl StreamCadence ===

impl StreamCadence {
    /// The cadence of stream `seq`, which outputs `output`, the first token after `ttft`.
    pub(crate) fn new(config: &SimConfig, seq: u64, ttft: Duration, output: Output) -> Self {
        StreamCadence {
            rng: SmallRng::seed_from_u64(config.seed ^ seq.wrapping_mul(STREAM_SEED_STRIDE)),
            ttft,
            offset: Duration::ZERO,
            events: 0,
            tokens_done: 0,
            output,
            think_pause: Duration::ZERO,
            own_stall_at: None,
        }
    }

    /// Pauses `pause` between the last reasoning token and the first answer token (when the
    /// stream reasons at all).
    pub(crate) fn with_think_pause(mut self, pause: Duration) -> Self {
        self.think_pause = pause;
        self
    }

    /// Adds a stall before token event `event` (from 1) of this stream alone.
    pub(crate) fn with_stall_at(mut self, event: Option<u64>) -> Self {
        self.own_stall_at = event;
        self
    }

    /// Plans the next step; `active` is the number of streams decoding right now (the
    /// contention load). `None` once every token is planned.
    pub(crate) fn next_step(&mut self, config: &SimConfig, active: u64) -> Option<Step> {
        if self.tokens_done >= self.output.total() {
            return None;
        }
        let event = self.events + 1;
        let mut wait = if event == 1 {
            self.ttft
        } else {
            self.sample_gap(config) + mul(config.contention_k, active)
        };
        wait += self.sample_stall(config, event);
        let pause = self.pause_before(self.tokens_done);
        let left = self.output.run_end(self.tokens_done) - self.tokens_done;
        let tokens = self.sample_step_tokens(config).min(left);
        let step = Step {
            offset: self.offset + wait + pause,
            first_token: self.tokens_done,
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            event,
            phase: self.output.phase(self.tokens_done),
            pause,
        };
        self.offset = step.offset;
        self.events = event;
        self.tokens_done += u64::from(step.tokens);
        Some(step)
    }

    /// Plans the next token of a stream in the shared decode loop (`--engine batch`), where the
    /// loop sets the time: one token, and the stream-local stall before it (zero if none).
    /// `None` once every token is planned.
    pub(crate) fn next_batch_step(&mut self, config: &SimConfig) -> Option<(Step, Duration)> {
        if self.tokens_done >= self.output.total() {
            return None;
        }
        let event = self.events + 1;
        let stall = self.sample_stall(config, event);
        let step = Step {
            offset: Duration::ZERO,
            first_token: self.tokens_done,
            tokens: 1,
            event,
            phase: self.output.phase(self.tokens_done),
            pause: self.pause_before(self.tokens_done),
        };
        self.events = event;
        self.tokens_done += 1;
        Some((step, stall))
    }

    /// The think pause before token `token`: only before the first answer token of a stream that
    /// reasoned.
    fn pause_before(&self, token: u64) -> Duration {
        let start = self.output.answer_start();
        if start > 0 && token == start {
            self.think_pause
        } else {
            Duration::ZERO
        }
    }

    /// The stall before token event `event`: placed (`--stall-at`), drawn (`--stall-prob`),
    /// both, or none.
    fn sample_stall(&mut self, config: &SimConfig, event: u64) -> Duration {
        let mut stall = Duration::ZERO;
        if config.stall_at.contains(&event) || self.own_stall_at == Some(event) {
            stall += config.stall;
        }
        if config.stall_prob > 0.0 && self.rng.gen_bool(config.stall_prob) {
            stall += config.stall;
        }
        stall
    }

    /// A decode step's time: the gap, or a log-normal draw whose median is the gap.
    fn sample_gap(&mut self, config: &SimConfig) -> Duration {
        if config.jitter <= 0.0 {
            return config.gap;
        }
        let z: f64 = self.rng.sample(StandardNormal);
        let factor = (config.jitter * z).exp();
        Duration::try_from_secs_f64(config.gap.as_secs_f64() * factor).unwrap_or(config.gap)
    }

    /// Tokens of one step: 1 plus the accepted draft tokens under speculative decoding.
    fn sample_step_tokens(&mut self, config: &SimConfig) -> u64 {
        let accepted = (0..config.spec_k)
            .filter(|_| self.rng.gen_bool(config.spec_accept))
            .count();
        1 + accepted as u64
    }
}

/// `d × n` without overflow panics.
fn mul(d: Duration, n: u64) -> Duration {
    d.checked_mul(u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn plan(config: &SimConfig, seq: u64, tokens: u64) -> Vec<Step> {
        let mut cadence = StreamCadence::new(config, seq, ms(100), Output::answer(tokens));
        std::iter::from_fn(|| cadence.next_step(config, 1)).collect()
    }

    fn gaps(steps: &[Step]) -> Vec<Duration> {
        steps
            .windows(2)
            .map(|w| w[1].offset - w[0].offset)
            .collect()
    }

    #[test]
    fn steady_gaps_are_exact() {
        let config = SimConfig {
            gap: ms(30),
            ..SimConfig::default()
        };
        let steps = plan(&config, 0, 10);
        assert_eq!(steps.len(), 10);
        assert_eq!(steps[0].offset, ms(100));
        assert!(gaps(&steps).iter().all(|g| *g == ms(30)));
        assert_eq!(steps[9].event, 10);
        assert_eq!(steps[9].first_token, 9);
    }

    #[test]
    fn same_seed_same_gaps_other_seed_other_gaps() {
        let config = SimConfig {
            jitter: 0.5,
            stall_prob: 0.05,
            spec_k: 3,
            ..SimConfig::default()
        };
        assert_eq!(plan(&config, 7, 200), plan(&config, 7, 200));
        assert_ne!(plan(&config, 7, 200), plan(&config, 8, 200));
        let reseeded = SimConfig {
            seed: 1,
            ..config.clone()
        };
        assert_ne!(plan(&config, 7, 200), plan(&reseeded, 7, 200));
    }

    #[test]
    fn log_normal_median_is_the_gap() {
        let config = SimConfig {
            gap: ms(50),
            jitter: 0.4,
            ..SimConfig::default()
        };
        let mut samples = gaps(&plan(&config, 3, 10_001));
        assert_eq!(samples.len(), 10_000);
        samples.sort();
        let median = samples[5_000].as_secs_f64() * 1e3;
        assert!((47.0..53.0).contains(&median), "median {median} ms");
        assert!(samples[9_900] > ms(100), "sigma 0.4 must spread the tail");
    }

    #[test]
    fn placed_stall_delays_exactly_that_event() {
        let config = SimConfig {
            gap: ms(10),
            stall_at: vec![5],
            stall: ms(300),
            ..SimConfig::default()
        };
        let g = gaps(&plan(&config, 0, 8));
        // gaps[i] precedes event i + 2, so event 5 follows gaps[3].
        assert_eq!(g[3], ms(310));
        assert_eq!(g.iter().filter(|g| **g > ms(200)).count(), 1);
    }

    #[test]
    fn contention_slows_every_step() {
        let config = SimConfig {
            gap: ms(10),
            contention_k: ms(2),
            ..SimConfig::default()
        };
        let mut cadence = StreamCadence::new(&config, 0, ms(0), Output::answer(3));
        let a = cadence.next_step(&config, 5).unwrap();
        let b = cadence.next_step(&config, 5).unwrap();
        assert_eq!(b.offset - a.offset, ms(20));
    }

    fn reasoning_agent() -> Output {
        Output {
            reasoning: 5,
            content: 4,
            tool_calls: 2,
            tool_call_tokens: 3,
            think_tags: crate::sim::config::ThinkTags::Parser,
        }
    }

    #[test]
    fn the_think_pause_comes_before_the_first_answer_token_only() {
        let config = SimConfig {
            gap: ms(10),
            ..SimConfig::default()
        };
        let mut cadence =
            StreamCadence::new(&config, 0, ms(100), reasoning_agent()).with_think_pause(ms(500));
        let steps: Vec<Step> = std::iter::from_fn(|| cadence.next_step(&config, 1)).collect();
        assert_eq!(steps.len(), 5 + 4 + 6);
        let g = gaps(&steps);
        // gaps[i] precedes step i + 1; step 5 (token 5) is the first answer token.
        assert_eq!(g[4], ms(510));
        assert_eq!(g.iter().filter(|g| **g != ms(10)).count(), 1, "{g:?}");
        assert_eq!(steps[5].pause, ms(500));
        let phases: Vec<Phase> = steps.iter().map(|s| s.phase).collect();
        assert_eq!(&phases[..5], [Phase::Reasoning; 5]);
        assert_eq!(&phases[5..9], [Phase::Content; 4]);
        assert_eq!(&phases[9..], [Phase::ToolCall; 6]);
    }

    #[test]
    fn speculative_steps_stop_at_every_phase_and_call_boundary() {
        let config = SimConfig {
            spec_k: 6,
            spec_accept: 1.0,
            ..SimConfig::default()
        };
        let mut cadence = StreamCadence::new(&config, 0, ms(0), reasoning_agent());
        let steps: Vec<(u64, u32)> = std::iter::from_fn(|| cadence.next_step(&config, 1))
            .map(|s| (s.first_token, s.tokens))
            .collect();
        // Every draft accepted: one step per run, cut at 5, 9, 12 and 15.
        assert_eq!(steps, [(0, 5), (5, 4), (9, 3), (12, 3)]);
    }

    #[test]
    fn batch_steps_carry_the_pause_apart_from_the_stall() {
        let config = SimConfig::default();
        let mut cadence =
            StreamCadence::new(&config, 0, ms(0), reasoning_agent()).with_think_pause(ms(200));
        let steps: Vec<(Step, Duration)> =
            std::iter::from_fn(|| cadence.next_batch_step(&config)).collect();
        assert_eq!(steps.len(), 15);
        let paused: Vec<u64> = steps
            .iter()
            .filter(|(s, _)| !s.pause.is_zero())
            .map(|(s, _)| s.first_token)
            .collect();
        assert_eq!(paused, [5]);
        assert!(steps.iter().all(|(_, stall)| stall.is_zero()));
    }

    #[test]
    fn speculative_steps_add_up_to_the_tokens() {
        let config = SimConfig {
            spec_k: 4,
            spec_accept: 0.7,
            ..SimConfig::default()
        };
        let steps = plan(&config, 0, 100);
        assert!(steps.len() < 100);
        assert_eq!(steps.iter().map(|s| u64::from(s.tokens)).sum::<u64>(), 100);
        assert!(steps.iter().all(|s| (1..=5).contains(&s.tokens)));
        for w in steps.windows(2) {
            assert_eq!(w[1].first_token, w[0].first_token + u64::from(w[0].tokens));
        }
    }
}
