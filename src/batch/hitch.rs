//! The hitch rule of one stream: is this token-event gap a hitch? Kept per stream, updated per
//! frame with no allocation, no lock and no shared state.
//!
//! A gap is a hitch when it is a stall (over the stall threshold), or when the stream has 8 gaps
//! and the gap is at least `gap_ratio` times the stream's running median gap (the median of its
//! last [`WINDOW`] gaps) and at least `min_gap`. The gaps are those between frames that carry
//! token events: the zero gaps between the token events of one frame (an engine or an edge
//! that writes several at once) are left out, or a stream that coalesces would have a median of
//! 0 and every ordinary gap over `min_gap` would be a hitch. The window is also kept sorted (the
//! new gap takes the leaving one's place and moves to its rank), so the median is read, not
//! selected: a selection over a copy of the window was most of the detector's cost per token
//! event (about 270 instructions in `scripts/instructions-per-event.sh`). The threshold is
//! recomputed every [`RECOMPUTE_EVERY`] gaps.

/// Gaps the running median is taken over.
pub const WINDOW: usize = 16;

/// Gaps a stream must have before the ratio part of the rule applies.
pub const MIN_GAPS: u32 = 8;

/// The threshold is recomputed after this many gaps (what counts as a hitch depends on it: kept
/// from when a selection made it costly).
const RECOMPUTE_EVERY: u32 = 4;

/// What the rule needs to know, in nanoseconds, fixed for a stream's life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HitchLimits {
    /// The stall threshold: a longer gap is always a hitch.
    pub stall_nanos: i64,
    /// `batch.gap_ratio`.
    pub gap_ratio: f64,
    /// `batch.min_gap`: no shorter gap is a ratio hitch.
    pub min_gap_nanos: i64,
}

/// One stream's running view of its own gaps.
#[derive(Debug, Clone)]
pub struct HitchRule {
    limits: HitchLimits,
    /// The last gaps in microseconds (saturated), a ring.
    window: [u32; WINDOW],
    /// The same gaps in ascending order, in `sorted[..filled]`.
    sorted: [u32; WINDOW],
    /// Gaps seen (saturating).
    gaps: u32,
    /// The ratio threshold now, in nanoseconds (`i64::MAX` until `MIN_GAPS` gaps).
    ratio_threshold: i64,
}

// === impl HitchRule ===

impl HitchRule {
    /// The rule of a new stream.
    pub fn new(limits: HitchLimits) -> Self {
        HitchRule {
            limits,
            window: [0; WINDOW],
            sorted: [0; WINDOW],
            gaps: 0,
            ratio_threshold: i64::MAX,
        }
    }

    /// A gap of `nanos` before a frame's first token event. Returns whether it is a hitch.
    #[inline]
    pub fn gap(&mut self, nanos: i64) -> bool {
        let hitch = nanos > self.limits.stall_nanos || nanos >= self.ratio_threshold;
        self.push(nanos);
        hitch
    }

    /// The silence after which the stream is inside a hitch (it would be one if a token came
    /// now): the smaller of the stall threshold and the ratio threshold.
    #[inline]
    pub fn threshold_nanos(&self) -> i64 {
        self.limits.stall_nanos.min(self.ratio_threshold)
    }

    #[inline]
    fn push(&mut self, nanos: i64) {
        let micros = u32::try_from(nanos.max(0) / 1_000).unwrap_or(u32::MAX);
        let slot = self.gaps as usize % WINDOW;
        let filled = (self.gaps as usize).min(WINDOW);
        // The new gap takes the place of the one that leaves the ring (or the next free one),
        // then moves to its rank: in a steady stream a few places.
        let (mut at, len) = if filled == WINDOW {
            let leaving = self.window[slot];
            let at = self.sorted.iter().position(|&v| v == leaving);
            (at.unwrap_or(WINDOW - 1), WINDOW)
        } else {
            (filled, filled + 1)
        };
        let sorted = &mut self.sorted[..len];
        sorted[at] = micros;
        while at > 0 && sorted[at - 1] > micros {
            sorted.swap(at - 1, at);
            at -= 1;
        }
        while at + 1 < len && sorted[at + 1] < micros {
            sorted.swap(at, at + 1);
            at += 1;
        }
        self.window[slot] = micros;
        self.gaps = self.gaps.saturating_add(1);
        if self.gaps >= MIN_GAPS && self.gaps % RECOMPUTE_EVERY == 0 {
            self.ratio_threshold = self.recompute();
        }
    }

    /// The median of the window's filled part (the upper one of an even count).
    #[inline]
    fn median_micros(&self) -> u32 {
        let filled = (self.gaps as usize).min(WINDOW);
        self.sorted[filled / 2]
    }

    /// `max(min_gap, gap_ratio × median)` over the window's filled part.
    fn recompute(&self) -> i64 {
        let scaled = f64::from(self.median_micros()) * 1_000.0 * self.limits.gap_ratio;
        let scaled = if scaled >= i64::MAX as f64 {
            i64::MAX
        } else {
            scaled as i64
        };
        scaled.max(self.limits.min_gap_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn rule() -> HitchRule {
        HitchRule::new(HitchLimits {
            stall_nanos: 500 * MS,
            gap_ratio: 4.0,
            min_gap_nanos: 20 * MS,
        })
    }

    #[test]
    fn only_stalls_before_eight_gaps() {
        let mut r = rule();
        assert!(!r.gap(10 * MS));
        assert!(!r.gap(300 * MS), "a ratio hitch needs 8 gaps first");
        assert!(r.gap(501 * MS), "a stall always is one");
        assert_eq!(r.threshold_nanos(), 500 * MS);
    }

    #[test]
    fn four_times_the_median_and_at_least_min_gap() {
        let mut r = rule();
        for _ in 0..8 {
            assert!(!r.gap(10 * MS));
        }
        assert_eq!(r.threshold_nanos(), 40 * MS);
        assert!(!r.gap(39 * MS));
        assert!(r.gap(40 * MS));
        // A fast stream (1 ms gaps): the floor is min_gap, not 4 ms.
        let mut fast = rule();
        for _ in 0..8 {
            fast.gap(MS);
        }
        assert_eq!(fast.threshold_nanos(), 20 * MS);
        assert!(!fast.gap(19 * MS));
        assert!(fast.gap(21 * MS));
    }

    #[test]
    fn the_median_follows_the_stream_and_shrugs_off_outliers() {
        let mut r = rule();
        for i in 0..64 {
            // Every fourth gap a hitch: the median stays at 10 ms.
            let gap = if i % 4 == 3 { 200 * MS } else { 10 * MS };
            r.gap(gap);
        }
        assert_eq!(r.threshold_nanos(), 40 * MS);
        for _ in 0..16 {
            r.gap(30 * MS);
        }
        assert_eq!(r.threshold_nanos(), 120 * MS);
    }

    #[test]
    fn a_gap_before_the_eighth_frame_is_judged_by_stalls_only() {
        let mut r = rule();
        for _ in 0..7 {
            r.gap(30 * MS);
        }
        assert!(!r.gap(400 * MS), "7 gaps before it: no median yet");
        // Now 8 gaps: 7 of 30 ms and one of 400: the median is 30, the threshold 120.
        assert_eq!(r.threshold_nanos(), 120 * MS);
        assert!(r.gap(120 * MS));
    }

    /// Property: the sorted copy always gives the median a selection over the ring's filled
    /// part gives, whatever the gaps (ties, saturation, zeros and a ring wrapping many times).
    #[test]
    fn property_the_sorted_window_gives_the_selected_median() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for run in 0..200 {
            let mut r = rule();
            for n in 0..(run % 70 + 1) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let gap = match x % 5 {
                    0 => 0,
                    1 => (x % 4) as i64 * MS,
                    2 => i64::MAX,
                    _ => (x % (900 * MS as u64)) as i64,
                };
                r.push(gap);
                let filled = ((n + 1) as usize).min(WINDOW);
                let mut copy = r.window;
                let part = &mut copy[..filled];
                let (_, median, _) = part.select_nth_unstable(filled / 2);
                assert_eq!(r.median_micros(), *median, "run {run}, gap {n}");
                let mut sorted = r.window[..filled].to_vec();
                sorted.sort_unstable();
                assert_eq!(&r.sorted[..filled], &sorted[..]);
            }
        }
    }

    /// Property: whatever the gaps, the rule never calls a gap under `min_gap` a hitch unless
    /// it is a stall, and always calls a stall one.
    #[test]
    fn property_floor_and_stalls_hold_for_any_gaps() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut r = rule();
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let gap = (x % (700 * MS as u64)) as i64 >> (x % 8);
            let hitch = r.gap(gap);
            if gap > 500 * MS {
                assert!(hitch);
            }
            if gap < 20 * MS {
                assert!(!hitch, "{gap}");
            }
        }
    }
}
