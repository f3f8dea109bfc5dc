//! Usage figures an upstream reports (`usage.completion_tokens`, `prompt_tokens` and each API's
//! kin), believed only when plausible: a counter fed a figure near 2^64 wraps, and Prometheus
//! reads a counter that goes down as a reset.
//!
//! A figure is refused, and the previous one kept, when it is above [`MAX_STREAM_TOKENS`] or
//! below a figure the same stream reported before (a running total never shrinks). Refusals are
//! counted per stream and reach `metronome_unparsed_events_total` with their reason.

/// The most tokens one stream may report, or be counted, for either direction: ten times the
/// largest context window offered today (10 million tokens). A stream claiming more is not
/// believed.
pub const MAX_STREAM_TOKENS: u64 = 100_000_000;

/// The usage figures one stream had refused, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageRefusals {
    /// Figures above [`MAX_STREAM_TOKENS`] (reason `usage_over_bound`).
    pub over_bound: u64,
    /// Figures below one the stream reported before (reason `usage_decreased`).
    pub decreased: u64,
}

// === impl UsageRefusals ===

impl UsageRefusals {
    /// The figure to keep once the upstream reported `reported` where `kept` was kept: the
    /// report when it is plausible, else `kept`, with the refusal counted.
    pub fn accept(&mut self, kept: Option<u64>, reported: u64) -> Option<u64> {
        if reported > MAX_STREAM_TOKENS {
            self.over_bound += 1;
            kept
        } else if kept.is_some_and(|k| reported < k) {
            self.decreased += 1;
            kept
        } else {
            Some(reported)
        }
    }

    /// A stream's whole output figure (usage or counted): itself when within the bound, else
    /// `None`, with the refusal counted.
    pub fn bound(&mut self, tokens: u64) -> Option<u64> {
        if tokens > MAX_STREAM_TOKENS {
            self.over_bound += 1;
            None
        } else {
            Some(tokens)
        }
    }

    /// Each count with its `reason` label in `metronome_unparsed_events_total`.
    pub fn by_reason(&self) -> [(u64, &'static str); 2] {
        [
            (self.over_bound, "usage_over_bound"),
            (self.decreased, "usage_decreased"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plausible_figure_is_kept_and_an_implausible_one_refused_and_counted() {
        let mut refused = UsageRefusals::default();
        let kept = refused.accept(None, 10);
        assert_eq!(kept, Some(10));
        assert_eq!(refused.accept(kept, u64::MAX), Some(10));
        assert_eq!(refused.accept(kept, MAX_STREAM_TOKENS + 1), Some(10));
        assert_eq!(refused.accept(kept, 9), Some(10));
        assert_eq!(refused.accept(kept, 10), Some(10));
        assert_eq!(
            refused.accept(kept, MAX_STREAM_TOKENS),
            Some(MAX_STREAM_TOKENS)
        );
        assert_eq!(refused.accept(None, u64::MAX), None);
        assert_eq!(
            refused,
            UsageRefusals {
                over_bound: 3,
                decreased: 1
            }
        );
        assert_eq!(refused.bound(MAX_STREAM_TOKENS + 1), None);
        assert_eq!(refused.bound(7), Some(7));
        assert_eq!(refused.by_reason()[0], (4, "usage_over_bound"));
    }
}
