//! The verdict, SMOOTH or JANKY: what the readers felt, stream by stream.
//!
//! A reader feels a stream, not a pool of gaps. A run where half the streams froze for 300 ms
//! has a stall share under 1 % of its gaps and an even pooled p99, yet half its readers saw the
//! text stop. So the verdict counts streams: the share of them that stalled, how uneven the
//! unluckier ones were, and how fast the median one read. It is a summary, not a gate: gates
//! (`--assert`) decide the exit code, and a failed gate makes the headline FAIL whatever the
//! verdict says (see `judged.rs`).

use serde::Serialize;

/// SMOOTH allows at most this percentage of streams with a stall (one reader in a hundred).
pub const MAX_STALLED_STREAMS_PCT: f64 = 1.0;

/// SMOOTH needs the p95 per-stream jank ratio under this: 95 % of streams keep their own p99
/// gap within 4 times their own median gap.
pub const MAX_STREAM_JANK_P95: f64 = 4.0;

/// SMOOTH needs the median stream to read faster than this many tokens/s (about a fast
/// reader's pace).
pub const MIN_TPS_P50: f64 = 7.0;

/// The rule in words, as `probe --help` and the README state it (a test keeps them equal).
pub const RULE: &str = "SMOOTH when at most 1% of the streams stalled (a gap over \
--stall-threshold), 95% of the streams with 8+ gaps keep their jank ratio under 4, and the \
median stream reads over 7 tokens/s; JANKY otherwise, and when there is no data to tell";

/// The one-word answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Few streams stalled, their cadence was even, at a comfortable reading speed.
    #[serde(rename = "SMOOTH")]
    Smooth,
    /// Too many streams stalled, uneven cadence, too slow, or no data to say otherwise.
    #[serde(rename = "JANKY")]
    Janky,
}

/// The figures the verdict is taken from (each `None` without data).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Evidence {
    /// Percentage (0-100) of the streams with a gap that had at least one stall.
    pub stalled_streams_pct: Option<f64>,
    /// p95 of the per-stream jank ratio (streams with 8+ gaps).
    pub stream_jank_p95: Option<f64>,
    /// Median per-stream tokens/s.
    pub tps_p50: Option<f64>,
}

// === impl Verdict ===

impl Verdict {
    /// `SMOOTH` or `JANKY`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Smooth => "SMOOTH",
            Verdict::Janky => "JANKY",
        }
    }
}

// === impl Evidence ===

impl Evidence {
    /// The verdict these figures earn (see [`RULE`]).
    pub fn verdict(&self) -> Verdict {
        if self.shortfalls().is_empty() {
            Verdict::Smooth
        } else {
            Verdict::Janky
        }
    }

    /// Why the verdict is what it is, in one line: the criteria met for SMOOTH, or the ones
    /// missed for JANKY.
    pub fn explain(&self) -> String {
        let shortfalls = self.shortfalls();
        if shortfalls.is_empty() {
            format!(
                "{:.1}% of streams stalled, per-stream jank p95 {:.2}, median {:.1} tokens/s",
                self.stalled_streams_pct.unwrap_or_default(),
                self.stream_jank_p95.unwrap_or_default(),
                self.tps_p50.unwrap_or_default()
            )
        } else {
            shortfalls.join("; ")
        }
    }

    /// Each criterion of SMOOTH this run misses, as a phrase.
    fn shortfalls(&self) -> Vec<String> {
        let mut missed = Vec::new();
        match self.stalled_streams_pct {
            Some(pct) if pct <= MAX_STALLED_STREAMS_PCT => {}
            Some(pct) => missed.push(format!(
                "{pct:.1}% of streams stalled (SMOOTH allows {MAX_STALLED_STREAMS_PCT}%)"
            )),
            None => missed.push("no stream had two token events".to_owned()),
        }
        match self.stream_jank_p95 {
            Some(jank) if jank < MAX_STREAM_JANK_P95 => {}
            Some(jank) => missed.push(format!(
                "per-stream jank p95 {jank:.2} (SMOOTH needs under {MAX_STREAM_JANK_P95})"
            )),
            None => missed.push("no stream had 8 gaps for a jank ratio".to_owned()),
        }
        match self.tps_p50 {
            Some(tps) if tps > MIN_TPS_P50 => {}
            Some(tps) => missed.push(format!(
                "median {tps:.1} tokens/s (SMOOTH needs over {MIN_TPS_P50})"
            )),
            None => missed.push("no stream had a tokens/s".to_owned()),
        }
        missed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(stalled: f64, jank: f64, tps: f64) -> Evidence {
        Evidence {
            stalled_streams_pct: Some(stalled),
            stream_jank_p95: Some(jank),
            tps_p50: Some(tps),
        }
    }

    #[test]
    fn even_streams_at_reading_speed_are_smooth() {
        let steady = evidence(0.0, 1.3, 33.0);
        assert_eq!(steady.verdict(), Verdict::Smooth);
        assert_eq!(
            steady.explain(),
            "0.0% of streams stalled, per-stream jank p95 1.30, median 33.0 tokens/s"
        );
        // The edges: 1% of streams stalled is still smooth; jank must be under 4, speed over 7.
        assert_eq!(evidence(1.0, 3.99, 7.01).verdict(), Verdict::Smooth);
        assert_eq!(evidence(1.01, 1.0, 30.0).verdict(), Verdict::Janky);
        assert_eq!(evidence(0.0, 4.0, 30.0).verdict(), Verdict::Janky);
        assert_eq!(evidence(0.0, 1.0, 7.0).verdict(), Verdict::Janky);
    }

    #[test]
    fn half_the_streams_frozen_is_janky_however_few_the_stalled_gaps() {
        // Half of 100 streams froze once for 300 ms among 200 gaps of 20 ms: 0.25% of the gaps
        // are stalls and the pooled p99 is a steady gap, but 50% of the readers saw a freeze.
        // Per stream, a frozen one's p99 gap (rank 198 of 200) is a steady gap, so its jank
        // ratio stays low: only the share of stalled streams catches it.
        let half_frozen = evidence(50.0, 1.1, 45.0);
        assert_eq!(half_frozen.verdict(), Verdict::Janky);
        assert_eq!(
            half_frozen.explain(),
            "50.0% of streams stalled (SMOOTH allows 1%)"
        );
    }

    #[test]
    fn a_few_uneven_streams_are_janky_without_a_stall() {
        // 1 stream in 10 with gaps 6 times its median but under the stall threshold.
        let uneven = evidence(0.0, 6.0, 30.0);
        assert_eq!(uneven.verdict(), Verdict::Janky);
        assert_eq!(
            uneven.explain(),
            "per-stream jank p95 6.00 (SMOOTH needs under 4)"
        );
    }

    #[test]
    fn smoothness_is_never_claimed_without_data() {
        let none = Evidence::default();
        assert_eq!(none.verdict(), Verdict::Janky);
        assert_eq!(
            none.explain(),
            "no stream had two token events; no stream had 8 gaps for a jank ratio; \
             no stream had a tokens/s"
        );
        let short = Evidence {
            stream_jank_p95: None,
            ..evidence(0.0, 1.0, 30.0)
        };
        assert_eq!(short.verdict(), Verdict::Janky);
        let slow_and_stalled = evidence(20.0, 1.0, 5.0);
        assert_eq!(
            slow_and_stalled.explain(),
            "20.0% of streams stalled (SMOOTH allows 1%); median 5.0 tokens/s (SMOOTH needs \
             over 7)"
        );
    }
}
