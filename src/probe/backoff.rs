//! What the probe does when streams fail one after another, so that a server that is down or
//! refuses every request is not hammered (a closed loop of failing streams would otherwise start
//! the next one the moment the last one failed: hundreds of thousands of connection attempts in
//! half a minute).
//!
//! - **Backoff**: after a failed stream, a closed-loop worker waits before its next start, 10 ms
//!   doubling with each failure in a row up to 1 s, times a random factor between 0.5 and 1 (so
//!   the workers do not retry in step), and not at all once a stream completes. The open loop
//!   keeps its schedule: its starts are already bounded by its rate.
//! - **Early end**: when the first [`GIVE_UP_AFTER`] streams to end all failed, no stream starts
//!   any more (those in flight finish): the run has shown the server is not serving, and it fails
//!   (exit 3) without spending its whole `--requests` or `--duration` on proving it again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The first wait after a failed stream.
pub const FIRST_WAIT: Duration = Duration::from_millis(10);

/// The longest wait: a worker of a run against a dead server starts at most one stream a second.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// The run ends early when this many streams have ended and every one of them failed: enough
/// that one refused connection or one 503 does not end a run, few enough to end in about a
/// second against a dead server.
pub const GIVE_UP_AFTER: u64 = 8;

/// The rule, as `probe --help` states it.
pub const RULE: &str = "When the first 8 streams to end all failed, the run ends early (no more \
streams start) and fails. After a failed stream a closed-loop worker waits before its next \
start: 10ms, doubling with each failure in a row up to 1s, with jitter; none after a stream \
that completes.";

/// The run's count of streams sent and ended, shared by every stream task: it says how many are
/// in flight (for the progress line) and whether another stream may start.
#[derive(Debug, Default)]
pub struct Starts {
    /// Streams handed to the client so far.
    sent: AtomicU64,
    /// Streams ended so far.
    ended: AtomicU64,
    /// Whether any stream ended without an error.
    any_completed: AtomicBool,
}

// === impl Starts ===

impl Starts {
    /// Counts a stream handed to the client.
    pub fn sent_one(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Streams handed to the client so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Counts a stream that ended, failed or not.
    pub fn ended_one(&self, failed: bool) {
        if !failed {
            self.any_completed.store(true, Ordering::Relaxed);
        }
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the first [`GIVE_UP_AFTER`] streams to end all failed, so no stream may start.
    pub fn gave_up(&self) -> bool {
        !self.any_completed.load(Ordering::Relaxed)
            && self.ended.load(Ordering::Relaxed) >= GIVE_UP_AFTER
    }
}

/// The wait before the next start after `failures_in_a_row` failed streams (0: none), with
/// `jitter` between 0.5 and 1 scaling the doubled wait.
pub fn wait_after(failures_in_a_row: u32, jitter: f64) -> Duration {
    if failures_in_a_row == 0 {
        return Duration::ZERO;
    }
    let doublings = (failures_in_a_row - 1).min(16);
    let wait = FIRST_WAIT.saturating_mul(1 << doublings).min(MAX_WAIT);
    wait.mul_f64(jitter.clamp(0.5, 1.0))
}

/// A random jitter factor between 0.5 and 1.
pub fn jitter() -> f64 {
    use rand::Rng;
    rand::thread_rng().gen_range(0.5..=1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_10ms_to_at_most_1s_and_jitter_only_shortens_it() {
        let full = |n| wait_after(n, 1.0);
        assert_eq!(full(0), Duration::ZERO);
        assert_eq!(full(1), Duration::from_millis(10));
        assert_eq!(full(2), Duration::from_millis(20));
        assert_eq!(full(7), Duration::from_millis(640));
        assert_eq!(full(8), MAX_WAIT);
        assert_eq!(full(u32::MAX), MAX_WAIT);
        assert_eq!(wait_after(3, 0.5), Duration::from_millis(20));
        assert_eq!(wait_after(3, 0.0), Duration::from_millis(20), "clamped");
        for _ in 0..100 {
            let wait = wait_after(4, jitter());
            assert!(wait >= Duration::from_millis(40) && wait <= Duration::from_millis(80));
        }
    }

    #[test]
    fn the_run_gives_up_only_when_every_stream_so_far_failed() {
        let starts = Starts::default();
        for _ in 0..GIVE_UP_AFTER - 1 {
            starts.ended_one(true);
        }
        assert!(!starts.gave_up());
        starts.ended_one(true);
        assert!(starts.gave_up());

        let one_good = Starts::default();
        one_good.ended_one(false);
        for _ in 0..100 {
            one_good.ended_one(true);
        }
        assert!(!one_good.gave_up(), "a server that served once is not down");
    }

    #[test]
    fn sent_streams_are_counted() {
        let starts = Starts::default();
        starts.sent_one();
        starts.sent_one();
        assert_eq!(starts.sent(), 2);
    }
}
