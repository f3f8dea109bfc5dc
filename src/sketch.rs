//! A fixed-size sketch of one stream's gaps, for its p50 and p99 (the jank ratio).
//!
//! Keeping every gap would make a stream's memory grow with its length. Log-spaced buckets with a
//! ratio of 1.04 between neighbours cover 1 µs to about 100 s in a few hundred counters, and any
//! quantile read from them is within 2% of the true gap. Gaps under 1 µs (events of one frame, gap
//! 0) have a bucket of their own.

use std::time::Duration;

/// Ratio between neighbouring bucket bounds.
const GAMMA: f64 = 1.04;
/// The smallest gap with a log bucket, in seconds; smaller ones count as zero.
const MIN_GAP: f64 = 1e-6;
/// Log buckets: 1 µs × 1.04^470 ≈ 100 s; longer gaps land in the last bucket.
const BUCKETS: usize = 470;

/// Gap counts in log-spaced buckets. Size: about 1.9 KiB, whatever the stream's length.
#[derive(Clone)]
pub struct GapSketch {
    zero: u32,
    counts: [u32; BUCKETS],
    total: u32,
}

impl std::fmt::Debug for GapSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GapSketch")
            .field("total", &self.total)
            .finish()
    }
}

impl Default for GapSketch {
    fn default() -> Self {
        GapSketch {
            zero: 0,
            counts: [0; BUCKETS],
            total: 0,
        }
    }
}

// === impl GapSketch ===

impl GapSketch {
    /// Adds `n` gaps of the same length.
    #[inline]
    pub fn add(&mut self, gap: Duration, n: u32) {
        let seconds = gap.as_secs_f64();
        if seconds < MIN_GAP {
            self.zero = self.zero.saturating_add(n);
        } else {
            let index = ((seconds / MIN_GAP).ln() / GAMMA.ln()) as usize;
            let slot = &mut self.counts[index.min(BUCKETS - 1)];
            *slot = slot.saturating_add(n);
        }
        self.total = self.total.saturating_add(n);
    }

    /// How many gaps were added.
    pub fn len(&self) -> u32 {
        self.total
    }

    /// True when no gap was added.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The gap at quantile `q` (0..=1) by nearest rank, within 2%; `None` for an empty sketch.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * f64::from(self.total)).ceil() as u64).max(1);
        let mut seen = u64::from(self.zero);
        if seen >= rank {
            return Some(Duration::ZERO);
        }
        for (index, count) in self.counts.iter().enumerate() {
            seen += u64::from(*count);
            if seen >= rank {
                // The bucket holds [MIN·γ^i, MIN·γ^(i+1)); its midpoint 2γ^(i+1)/(1+γ)·MIN
                // is within (γ-1)/(γ+1) < 2% of any value in it.
                let upper = MIN_GAP * GAMMA.powi(index as i32 + 1);
                return Some(Duration::from_secs_f64(2.0 * upper / (1.0 + GAMMA)));
            }
        }
        None
    }

    /// p99 gap / max(p50 gap, 1 ms), for streams with at least `min_gaps` gaps.
    pub fn jank_ratio(&self, min_gaps: u32) -> Option<f64> {
        if self.total < min_gaps {
            return None;
        }
        let p50 = self.quantile(0.50)?.as_secs_f64().max(0.001);
        let p99 = self.quantile(0.99)?.as_secs_f64();
        Some(p99 / p50)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_two_percent() {
        let mut sketch = GapSketch::default();
        let mut exact = Vec::new();
        for i in 1..=1000u64 {
            let gap = Duration::from_micros(i * i * 37 % 2_000_000 + 50);
            sketch.add(gap, 1);
            exact.push(gap);
        }
        exact.sort();
        for q in [0.5, 0.9, 0.99] {
            let rank = (q * 1000.0_f64).ceil() as usize - 1;
            let truth = exact[rank].as_secs_f64();
            let got = sketch.quantile(q).unwrap().as_secs_f64();
            assert!((got - truth).abs() / truth < 0.02, "q{q}: {got} vs {truth}");
        }
    }

    #[test]
    fn zero_gaps_and_jank() {
        let mut sketch = GapSketch::default();
        assert_eq!(sketch.jank_ratio(8), None);
        sketch.add(Duration::ZERO, 3);
        sketch.add(Duration::from_millis(30), 96);
        sketch.add(Duration::from_millis(300), 1);
        assert_eq!(sketch.quantile(0.01), Some(Duration::ZERO));
        let jank = sketch.jank_ratio(8).unwrap();
        assert!(
            (0.98..1.02).contains(&jank),
            "p99 is still a 30 ms gap: {jank}"
        );
        sketch.add(Duration::from_millis(300), 2);
        let jank = sketch.jank_ratio(8).unwrap();
        assert!((9.6..10.4).contains(&jank), "{jank}");
    }

    #[test]
    fn size_is_fixed() {
        assert!(std::mem::size_of::<GapSketch>() < 2048);
    }
}
