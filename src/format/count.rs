//! Server-reported running token counts, turned into exact per-event counts.
//!
//! Several servers report how many tokens they have generated so far (vLLM's continuous usage,
//! llama.cpp's `tokens_predicted`, SGLang's `meta_info.completion_tokens`, Gemini's
//! `candidatesTokenCount`). The growth of that count since the previous token event is what the
//! token event carried: tokens the server produced in between without showing them (bytes held
//! back until they form valid UTF-8, a special token) surface with the next event that shows
//! something.

/// One running count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunningCount {
    /// The count at the previous token event.
    at_last_token_event: u64,
}

// === impl RunningCount ===

impl RunningCount {
    /// A token event at which the server's count is `now`: the tokens it carried, when positive.
    pub(crate) fn token_event(&mut self, now: u64) -> Option<u32> {
        let grew = now.saturating_sub(self.at_last_token_event);
        self.at_last_token_event = now;
        u32::try_from(grew).ok().filter(|n| *n > 0)
    }
}

/// How many sequences of one stream are told apart ([`Indexed`]); later indices share the last
/// slot, which keeps the state fixed-size at the price of exactness past 16 parallel sequences.
pub(crate) const MAX_INDICES: usize = 16;

/// Per-sequence state for a stream that interleaves several sequences (`n > 1`, or a batch of
/// prompts), each with its own running count, kept in a fixed array so memory does not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Indexed<T> {
    slots: [T; MAX_INDICES],
}

impl<T: Default + Copy> Default for Indexed<T> {
    fn default() -> Self {
        Indexed {
            slots: [T::default(); MAX_INDICES],
        }
    }
}

// === impl Indexed ===

impl<T> Indexed<T> {
    /// The slot of sequence `index`.
    pub(crate) fn slot(&mut self, index: u64) -> &mut T {
        let last = MAX_INDICES - 1;
        let i = usize::try_from(index).map_or(last, |i| i.min(last));
        &mut self.slots[i]
    }

    /// The sum of `value` over all sequences: the stream's total.
    pub(crate) fn sum(&self, value: impl Fn(&T) -> u64) -> u64 {
        self.slots.iter().map(value).sum()
    }
}

/// A sequence's running count and the latest value the server reported for it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SequenceCount {
    /// Per-event growth at token events.
    pub(crate) running: RunningCount,
    /// The latest count reported.
    pub(crate) latest: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_count_gives_the_growth_since_the_last_token_event() {
        let mut count = RunningCount::default();
        assert_eq!(count.token_event(1), Some(1));
        assert_eq!(count.token_event(4), Some(3));
        assert_eq!(count.token_event(4), None);
        assert_eq!(count.token_event(9), Some(5));
    }

    #[test]
    fn sequences_count_apart_and_large_indices_share_the_last_slot() {
        let mut seqs = Indexed::<SequenceCount>::default();
        seqs.slot(0).latest = 3;
        seqs.slot(1).latest = 4;
        let total = |seqs: &Indexed<SequenceCount>| seqs.sum(|s| s.latest);
        assert_eq!(total(&seqs), 7);
        seqs.slot(99).latest = 5;
        seqs.slot(u64::MAX).latest = 6;
        assert_eq!(total(&seqs), 13);
        assert_eq!(seqs.slot(0).running.token_event(3), Some(3));
        assert_eq!(seqs.slot(1).running.token_event(2), Some(2));
    }
}
