//! What the sim has served, readable while it runs: the proxy's tests use it to see that the
//! upstream really stopped working on a stream its client abandoned, and the token events of each
//! phase it handed over, the truth a measurement of phases is checked against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::stream::PhaseEvents;

/// Counters of generation requests (streaming or not), updated by the server with atomics only,
/// so streams never share a lock.
#[derive(Debug, Default)]
pub struct SimStats {
    /// Requests being generated now; also the load that `contention_k` slows every stream by.
    active: AtomicU64,
    /// Requests accepted for generation since start.
    started: AtomicU64,
    /// Requests whose whole output was handed to the connection.
    completed: AtomicU64,
    /// Requests dropped before their output was complete (the client went away).
    cancelled: AtomicU64,
    /// Reasoning token events handed to connections.
    reasoning_events: AtomicU64,
    /// Answer token events handed to connections.
    content_events: AtomicU64,
    /// Tool-call token events handed to connections.
    tool_call_events: AtomicU64,
}

/// A copy of [`SimStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStatsSnapshot {
    /// Requests being generated now.
    pub active: u64,
    /// Requests accepted for generation since start.
    pub started: u64,
    /// Requests whose whole output was handed to the connection.
    pub completed: u64,
    /// Requests dropped before their output was complete.
    pub cancelled: u64,
    /// Reasoning token events handed to connections.
    pub reasoning_events: u64,
    /// Answer token events handed to connections.
    pub content_events: u64,
    /// Tool-call token events handed to connections.
    pub tool_call_events: u64,
}

// === impl SimStats ===

impl SimStats {
    /// Requests being generated now.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Requests accepted for generation since start.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Requests whose whole output was handed to the connection.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Requests dropped before their output was complete.
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// All counters at once (each read on its own; they may be a moment apart).
    pub fn snapshot(&self) -> SimStatsSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        SimStatsSnapshot {
            active: self.active(),
            started: self.started(),
            completed: self.completed(),
            cancelled: self.cancelled(),
            reasoning_events: load(&self.reasoning_events),
            content_events: load(&self.content_events),
            tool_call_events: load(&self.tool_call_events),
        }
    }

    /// Counts token events handed to a connection, by phase.
    pub(crate) fn served(&self, events: PhaseEvents) {
        for (counter, n) in [
            (&self.reasoning_events, events.reasoning),
            (&self.content_events, events.content),
            (&self.tool_call_events, events.tool_call),
        ] {
            if n > 0 {
                counter.fetch_add(u64::from(n), Ordering::Relaxed);
            }
        }
    }
}

/// Holds one request's place in [`SimStats`]: counted active while alive, and on drop counted
/// completed or cancelled exactly once, whichever way the request ended.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    stats: Arc<SimStats>,
    completed: bool,
}

// === impl StreamGuard ===

impl StreamGuard {
    /// Counts a new request as started and active.
    pub(crate) fn start(stats: Arc<SimStats>) -> Self {
        stats.started.fetch_add(1, Ordering::Relaxed);
        stats.active.fetch_add(1, Ordering::Relaxed);
        StreamGuard {
            stats,
            completed: false,
        }
    }

    /// The request's output is complete; dropping the guard now counts it completed.
    pub(crate) fn complete(&mut self) {
        self.completed = true;
    }

    /// Requests active now, this one included: the contention load.
    pub(crate) fn active(&self) -> u64 {
        self.stats.active()
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let outcome = if self.completed {
            &self.stats.completed
        } else {
            &self.stats.cancelled
        };
        outcome.fetch_add(1, Ordering::Relaxed);
        self.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_each_outcome_once() {
        let stats = Arc::new(SimStats::default());
        let mut done = StreamGuard::start(stats.clone());
        let abandoned = StreamGuard::start(stats.clone());
        assert_eq!(stats.active(), 2);
        done.complete();
        drop(done);
        drop(abandoned);
        let expected = SimStatsSnapshot {
            active: 0,
            started: 2,
            completed: 1,
            cancelled: 1,
            ..SimStatsSnapshot::default()
        };
        assert_eq!(stats.snapshot(), expected);
    }

    #[test]
    fn served_token_events_are_counted_by_phase() {
        let stats = SimStats::default();
        stats.served(PhaseEvents {
            reasoning: 2,
            content: 1,
            tool_call: 0,
        });
        stats.served(PhaseEvents {
            reasoning: 0,
            content: 3,
            tool_call: 4,
        });
        let snap = stats.snapshot();
        assert_eq!(
            (
                snap.reasoning_events,
                snap.content_events,
                snap.tool_call_events
            ),
            (2, 4, 4)
        );
    }
}
