//! `[batch]` validated: the settings of batch-wide hitch and episode detection (the batch detector).

use std::time::Duration;

/// The `[batch]` section, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchSettings {
    /// Whether hitches and episodes are tracked at all.
    pub enabled: bool,
    /// A gap at least this many times the stream's running median is a hitch (with `min_gap`).
    pub gap_ratio: f64,
    /// No gap shorter than this is a ratio hitch.
    pub min_gap: Duration,
    /// Fewest streams inside a hitch at once for an episode.
    pub min_streams: usize,
    /// Least share of the upstream's streams past their first token inside a hitch at once.
    pub min_share: f64,
    /// Requests received this long before an episode began are its arrivals.
    pub lookback: Duration,
    /// The time constant over which each stream's hitch rate is decayed (the chance rule).
    pub rate_window: Duration,
    /// The largest chance that independent stalls alone make an episode, per moment judged.
    pub false_positive: f64,
}

impl Default for BatchSettings {
    fn default() -> Self {
        BatchSettings {
            enabled: true,
            gap_ratio: 4.0,
            min_gap: Duration::from_millis(20),
            min_streams: 2,
            min_share: 0.5,
            lookback: Duration::from_secs(2),
            rate_window: Duration::from_secs(30),
            false_positive: 1e-6,
        }
    }
}

// === impl BatchSettings ===

impl BatchSettings {
    /// `lookback` in nanoseconds.
    pub fn lookback_nanos(&self) -> i64 {
        i64::try_from(self.lookback.as_nanos()).unwrap_or(i64::MAX)
    }

    /// `rate_window` in seconds (at least a millisecond).
    pub fn rate_window_secs(&self) -> f64 {
        self.rate_window.as_secs_f64().max(1e-3)
    }

    /// `min_gap` in nanoseconds.
    pub fn min_gap_nanos(&self) -> i64 {
        i64::try_from(self.min_gap.as_nanos()).unwrap_or(i64::MAX)
    }

    /// How often an upstream's streams are swept: half of `min_gap`, between 5 and 25 ms, so a
    /// silence past a threshold is seen within half the shortest hitch. A sweep reads only the
    /// beats of streams whose deadline came or whose silence may have ended (docs/batch.md, "How
    /// it is measured"), but each sweep has a fixed cost (a lock, a timer, the task's poll), so
    /// it is not made finer.
    pub fn sweep_interval(&self) -> Duration {
        (self.min_gap / 2).clamp(Duration::from_millis(5), Duration::from_millis(25))
    }
}
