//! The live flush (`metrics.flush_interval`): the streams in flight, swept every interval, each
//! merging what it counted since the last sweep into the shared metric families.
//!
//! A stream counts its gaps in local histograms, lock-free per frame, and used to publish them
//! only when it ended: a 300 ms stall in a two-minute stream reached `/metrics` two minutes
//! late. Each metered stream registers here once, as a weak handle; one task sweeps the list
//! every interval, and each live stream flushes under the locks its frames already take (one
//! per point, once per interval, never per frame). The end of a stream merges what is left, so
//! every gap is counted exactly once, whether it is flushed live or at the end.

use crate::poison::LockExt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A stream in flight whose counts can be flushed while it runs.
pub trait Flush: Send + Sync {
    /// Merges what the stream counted since its last flush into the metrics.
    fn flush(&self);
}

/// The streams in flight, as weak handles: a stream that ended is forgotten at the next sweep.
#[derive(Default)]
pub struct LiveStreams {
    streams: Mutex<Vec<Weak<dyn Flush>>>,
    /// The handles one sweep flushes, kept between sweeps so a sweep allocates nothing once it
    /// has room for the streams in flight.
    sweeping: Mutex<Vec<Arc<dyn Flush>>>,
}

impl std::fmt::Debug for LiveStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveStreams").finish_non_exhaustive()
    }
}

impl LiveStreams {
    /// Adds a stream that has just started (once per stream, not per frame).
    pub fn register(&self, stream: Weak<dyn Flush>) {
        self.streams.lock_or_recover().push(stream);
    }

    /// Streams registered and not yet forgotten (those that ended since the last sweep too).
    pub fn len(&self) -> usize {
        self.streams.lock_or_recover().len()
    }

    /// True when no stream is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flushes every stream still in flight and forgets those that ended; returns how many were
    /// flushed. The list's lock is held only to take the handles, not while streams flush.
    pub fn sweep(&self) -> usize {
        let mut live = self.sweeping.lock_or_recover();
        {
            let mut streams = self.streams.lock_or_recover();
            streams.retain(|stream| stream.strong_count() > 0);
            live.extend(streams.iter().filter_map(Weak::upgrade));
        }
        for stream in live.iter() {
            stream.flush();
        }
        let flushed = live.len();
        // A stream whose last holder is this list ends here, and records itself.
        live.clear();
        flushed
    }

    /// Sweeps every `interval` until the task is dropped or aborted.
    pub async fn run(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        // A sweep delayed by a busy machine is not made up for with a burst of sweeps.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            self.sweep();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting(AtomicUsize);

    impl Flush for Counting {
        fn flush(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_sweep_flushes_the_live_streams_and_forgets_the_ended() {
        let live = LiveStreams::default();
        let a = Arc::new(Counting(AtomicUsize::new(0)));
        let b = Arc::new(Counting(AtomicUsize::new(0)));
        let a_dyn: Arc<dyn Flush> = a.clone();
        let b_dyn: Arc<dyn Flush> = b.clone();
        live.register(Arc::downgrade(&a_dyn));
        live.register(Arc::downgrade(&b_dyn));
        drop((a_dyn, b_dyn));
        assert_eq!(live.sweep(), 2);
        assert_eq!(live.sweep(), 2);
        drop(b);
        assert_eq!(live.sweep(), 1);
        assert_eq!(live.len(), 1);
        assert_eq!(a.0.load(Ordering::Relaxed), 3);
        drop(a);
        assert_eq!(live.sweep(), 0);
        assert!(live.is_empty());
    }
}
