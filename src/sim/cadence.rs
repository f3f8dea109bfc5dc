//! When each decode step of a stream happens and how many tokens it yields.
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
    /// Tokens this stream outputs in all.
    tokens_total: u64,
    /// A stall before this token event of this stream only (the request's `sim_stall_at`).
    own_stall_at: Option<u64>,
}

// === impl StreamCadence ===

impl StreamCadence {
    /// The cadence of stream `seq`, which outputs `tokens_total` tokens, the first after `ttft`.
    pub(crate) fn new(config: &SimConfig, seq: u64, ttft: Duration, tokens_total: u64) -> Self {
        StreamCadence {
            rng: SmallRng::seed_from_u64(config.seed ^ seq.wrapping_mul(STREAM_SEED_STRIDE)),
            ttft,
            offset: Duration::ZERO,
            events: 0,
            tokens_done: 0,
            tokens_total,
            own_stall_at: None,
        }
    }

    /// Adds a stall before token event `event` (from 1) of this stream alone.
    pub(crate) fn with_stall_at(mut self, event: Option<u64>) -> Self {
        self.own_stall_at = event;
        self
    }

    /// Plans the next step; `active` is the number of streams decoding right now (the
    /// contention load). `None` once every token is planned.
    pub(crate) fn next_step(&mut self, config: &SimConfig, active: u64) -> Option<Step> {
        if self.tokens_done >= self.tokens_total {
            return None;
        }
        let event = self.events + 1;
        let mut wait = if event == 1 {
            self.ttft
        } else {
            self.sample_gap(config) + mul(config.contention_k, active)
        };
        wait += self.sample_stall(config, event);
        let left = self.tokens_total - self.tokens_done;
        let tokens = self.sample_step_tokens(config).min(left);
        let step = Step {
            offset: self.offset + wait,
            first_token: self.tokens_done,
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            event,
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
        if self.tokens_done >= self.tokens_total {
            return None;
        }
        let event = self.events + 1;
        let stall = self.sample_stall(config, event);
        let step = Step {
            offset: Duration::ZERO,
            first_token: self.tokens_done,
            tokens: 1,
            event,
        };
        self.events = event;
        self.tokens_done += 1;
        Some((step, stall))
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
        let mut cadence = StreamCadence::new(config, seq, ms(100), tokens);
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
        let mut cadence = StreamCadence::new(&config, 0, ms(0), 3);
        let a = cadence.next_step(&config, 5).unwrap();
        let b = cadence.next_step(&config, 5).unwrap();
        assert_eq!(b.offset - a.offset, ms(20));
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
