//! Phases (docs/design.md section 3): what kind of output a token event shows, the per-frame
//! summary of its token events' phases, and the no-parser `<think>` shape.
//!
//! Each accountant reports the phase its API names ([`Classified::phase`]). A model served
//! without a reasoning parser streams its thinking inside the content, between two tags; a
//! [`ThinkState`] per stream reads the content's text until it knows whether the stream opened
//! with the tag (or, for a route whose template opens the thinking in the prompt, until the
//! closing tag), and is settled from then on, so the common stream pays one branch per event.
//!
//! [`Classified::phase`]: super::Classified::phase

use std::sync::Arc;

use super::Classified;

/// The phase of a token event: the model's thinking, the answer a person reads, or tool-call
/// arguments. Its name is the `phase` label's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The model's thinking (`reasoning_content`, `thinking_delta`, `thought` parts, text
    /// between think tags …).
    Reasoning,
    /// Answer text (or speech) a person reads.
    #[default]
    Content,
    /// Tool or function-call arguments.
    ToolCall,
}

// === impl Phase ===

impl Phase {
    /// Every phase, in the order a stream goes through them (and [`Phase::index`]'s order).
    pub const ALL: [Phase; 3] = [Phase::Reasoning, Phase::Content, Phase::ToolCall];

    /// The name in labels and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Reasoning => "reasoning",
            Phase::Content => "content",
            Phase::ToolCall => "tool_call",
        }
    }

    /// The place of the phase in [`Phase::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// How visible the phase is to a reader: an event carrying several kinds counts in the most
    /// visible one (content before tool_call before reasoning).
    fn rank(self) -> u8 {
        match self {
            Phase::Reasoning => 0,
            Phase::ToolCall => 1,
            Phase::Content => 2,
        }
    }

    /// The phase of an event that carries `self` and `other`: the one the reader sees.
    pub(crate) fn or_visible(self, other: Phase) -> Phase {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    /// The phase of an event that carries `found` (if anything yet) and `other`.
    pub(crate) fn join(found: Option<Phase>, other: Phase) -> Phase {
        found.map_or(other, |p| p.or_visible(other))
    }
}

/// How many token events of one phase other than content a [`PhaseMix`] tells apart in one
/// frame; more of one phase in one frame count as content. A frame is one read of the upstream
/// (at most tens of KiB) and an event at least a few bytes, so no real frame comes near it.
pub const MAX_PHASE_EVENTS_PER_FRAME: u32 = (1 << 15) - 1;

/// The phases of one frame's token events, in the four bytes that travel with the frame to its
/// egress stamp: 0 when every token event is content (the common frame, which takes the one
/// branch), otherwise the phase of the frame's first token event (the one whose gap is not 0)
/// and how many are reasoning and tool_call; the rest of the frame's token events are content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PhaseMix(u32);

const FIRST_BITS: u32 = 0b11;
const REASONING_SHIFT: u32 = 2;
const TOOL_CALL_SHIFT: u32 = 17;

// === impl PhaseMix ===

impl PhaseMix {
    /// Every token event is content.
    pub const ALL_CONTENT: PhaseMix = PhaseMix(0);

    /// True when every token event of the frame is content.
    #[inline]
    pub fn is_all_content(self) -> bool {
        self.0 == 0
    }

    /// Adds a token event of `phase`; `first` when it is the frame's first token event. A content
    /// event that is not first changes nothing, so the sink calls this only for the others.
    #[cold]
    pub fn add(&mut self, phase: Phase, first: bool) {
        let (code, shift) = match phase {
            Phase::Content => (0, None),
            Phase::Reasoning => (1, Some(REASONING_SHIFT)),
            Phase::ToolCall => (2, Some(TOOL_CALL_SHIFT)),
        };
        if first {
            self.0 = (self.0 & !FIRST_BITS) | code;
        }
        if let Some(shift) = shift {
            if (self.0 >> shift) & MAX_PHASE_EVENTS_PER_FRAME < MAX_PHASE_EVENTS_PER_FRAME {
                self.0 += 1 << shift;
            }
        }
    }

    /// The four bytes as they travel (a timeline keeps them).
    pub fn to_bits(self) -> u32 {
        self.0
    }

    /// A mix from [`PhaseMix::to_bits`].
    pub fn from_bits(bits: u32) -> PhaseMix {
        PhaseMix(bits)
    }

    /// The phase of the frame's first token event.
    pub fn first(self) -> Phase {
        match self.0 & FIRST_BITS {
            1 => Phase::Reasoning,
            2 => Phase::ToolCall,
            _ => Phase::Content,
        }
    }

    /// How many of the frame's `total` token events are of `phase`.
    pub fn count(self, phase: Phase, total: u32) -> u32 {
        let reasoning = (self.0 >> REASONING_SHIFT) & MAX_PHASE_EVENTS_PER_FRAME;
        let tool_call = (self.0 >> TOOL_CALL_SHIFT) & MAX_PHASE_EVENTS_PER_FRAME;
        match phase {
            Phase::Reasoning => reasoning.min(total),
            Phase::ToolCall => tool_call.min(total.saturating_sub(reasoning)),
            Phase::Content => total.saturating_sub(reasoning + tool_call),
        }
    }

    /// The counts of each phase of `total` token events, in [`Phase::ALL`]'s order.
    pub fn counts(self, total: u32) -> [u32; 3] {
        Phase::ALL.map(|p| self.count(p, total))
    }

    /// The phase the frame's token events show most of, for marking a frame; `None` without
    /// token events.
    pub fn main(self, total: u32) -> Option<Phase> {
        let counts = self.counts(total);
        (total > 0).then(|| {
            Phase::ALL
                .into_iter()
                .max_by_key(|p| (counts[p.index()], p.rank()))
                .unwrap_or(Phase::Content)
        })
    }
}

/// The tags a model without a reasoning parser puts around its thinking (a route's
/// `think_tags`; `<think>` and `</think>` by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkTags {
    open: Box<[u8]>,
    close: Box<[u8]>,
}

/// The default tags, as DeepSeek-R1, Qwen3 and their kin write them.
const DEFAULT_OPEN: &[u8] = b"<think>";
const DEFAULT_CLOSE: &[u8] = b"</think>";

// === impl ThinkTags ===

impl ThinkTags {
    /// Tags `open` and `close`; `None` when either is empty or longer than 64 bytes.
    pub fn new(open: &str, close: &str) -> Option<ThinkTags> {
        let ok = |t: &str| !t.is_empty() && t.len() <= 64;
        (ok(open) && ok(close)).then(|| ThinkTags {
            open: open.as_bytes().into(),
            close: close.as_bytes().into(),
        })
    }
}

/// How a route's streams begin (its `think_starts_open` key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ThinkStart {
    /// Reasoning only when the content begins with the opening tag.
    #[default]
    Detect,
    /// The chat template opened the thinking in the prompt: everything up to the closing tag is
    /// reasoning.
    Open,
}

/// A route's setting for the no-parser shape, shared by its streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThinkSettings {
    /// The route's own tags; `None` for the default ones.
    pub tags: Option<Arc<ThinkTags>>,
    /// How its streams begin.
    pub start: ThinkStart,
}

/// Where a stream is in the no-parser shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TagState {
    /// No content text yet (leading whitespace aside); `matched` bytes of the opening tag seen.
    Start { matched: u8 },
    /// Inside the thinking; `matched` bytes of the closing tag seen.
    Inside { matched: u8 },
    /// Decided: content is content from here on.
    Settled,
}

/// One stream's reading of the no-parser `<think>` shape: the phase of each content event.
#[derive(Debug, Clone)]
pub struct ThinkState {
    tags: Option<Arc<ThinkTags>>,
    state: TagState,
}

impl Default for ThinkState {
    fn default() -> Self {
        ThinkState::new(&ThinkSettings::default())
    }
}

// === impl ThinkState ===

impl ThinkState {
    /// The state of a new stream of a route with `settings`.
    pub fn new(settings: &ThinkSettings) -> Self {
        let state = match settings.start {
            ThinkStart::Detect => TagState::Start { matched: 0 },
            ThinkStart::Open => TagState::Inside { matched: 0 },
        };
        ThinkState {
            tags: settings.tags.clone(),
            state,
        }
    }

    /// True once the stream's content can no longer turn out to be reasoning.
    #[inline]
    pub fn is_settled(&self) -> bool {
        self.state == TagState::Settled
    }

    /// The phase of a token event the accountant `classified`: the one decision of a token
    /// event's phase, shared by the proxy's meter and the probe.
    #[inline]
    pub fn phase(&mut self, classified: &Classified<'_>) -> Phase {
        if self.is_settled() || classified.phase != Phase::Content {
            return classified.phase;
        }
        self.content(classified.text.unwrap_or_default())
    }

    /// A content event's phase, from its text (a JSON string's raw inside, escapes and all).
    #[cold]
    fn content(&mut self, raw: &[u8]) -> Phase {
        let (open, close) = match &self.tags {
            Some(tags) => (&*tags.open, &*tags.close),
            None => (DEFAULT_OPEN, DEFAULT_CLOSE),
        };
        let mut bytes = Unescaped { raw, at: 0 };
        if let TagState::Start { mut matched } = self.state {
            loop {
                let Some(b) = bytes.next() else {
                    self.state = TagState::Start { matched };
                    // Only whitespace shows nothing yet; part of the tag is most likely the tag.
                    return if matched > 0 {
                        Phase::Reasoning
                    } else {
                        Phase::Content
                    };
                };
                if matched == 0 && b.is_ascii_whitespace() {
                    continue;
                }
                if open.get(usize::from(matched)) != Some(&b) {
                    self.state = TagState::Settled;
                    return Phase::Content;
                }
                matched += 1;
                if usize::from(matched) == open.len() {
                    self.state = TagState::Inside { matched: 0 };
                    break;
                }
            }
        }
        let TagState::Inside { mut matched } = self.state else {
            return Phase::Content;
        };
        while let Some(b) = bytes.next() {
            if close.get(usize::from(matched)) == Some(&b) {
                matched += 1;
            } else {
                matched = u8::from(close.first() == Some(&b));
            }
            if usize::from(matched) == close.len() {
                self.state = TagState::Settled;
                // Answer text after the closing tag in the same event: the reader sees it.
                let rest_shows =
                    std::iter::from_fn(|| bytes.next()).any(|b| !b.is_ascii_whitespace());
                return if rest_shows {
                    Phase::Content
                } else {
                    Phase::Reasoning
                };
            }
        }
        self.state = TagState::Inside { matched };
        Phase::Reasoning
    }
}

/// The bytes of a JSON string's raw inside with its escapes undone where they stand for ASCII
/// (`\n`, `\u003c` …); an escape of anything else reads as a byte no tag holds.
struct Unescaped<'a> {
    raw: &'a [u8],
    at: usize,
}

impl Iterator for Unescaped<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let b = *self.raw.get(self.at)?;
        self.at += 1;
        if b != b'\\' {
            return Some(b);
        }
        let e = *self.raw.get(self.at)?;
        self.at += 1;
        Some(match e {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'u' => {
                let hex = self.raw.get(self.at..self.at + 4).unwrap_or_default();
                self.at += 4;
                std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(|c| u8::try_from(c).ok())
                    .filter(u8::is_ascii)
                    .unwrap_or(0xff)
            }
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn content(text: &'static str) -> Classified<'static> {
        Classified {
            token_event: true,
            text: Some(text.as_bytes()),
            ..Classified::default()
        }
    }

    fn phases(state: &mut ThinkState, texts: &[&'static str]) -> Vec<Phase> {
        texts.iter().map(|t| state.phase(&content(t))).collect()
    }

    use Phase::{Content as C, Reasoning as R, ToolCall as T};

    #[test]
    fn thinking_between_tags_at_the_start_is_reasoning_even_split_across_events() {
        let mut state = ThinkState::default();
        let got = phases(
            &mut state,
            &[
                "<thi",
                "nk>",
                "\\nHmm",
                " let me see",
                "</th",
                "ink>",
                "\\n\\n",
                "Hello",
                "<think>",
            ],
        );
        assert_eq!(got, [R, R, R, R, R, R, C, C, C]);
        assert!(state.is_settled());
    }

    #[test]
    fn answer_text_after_the_closing_tag_in_one_event_is_content() {
        let mut state = ThinkState::default();
        assert_eq!(
            phases(&mut state, &["\\n<think>x", "y</think>\\n\\nHi", "there"]),
            [R, C, C]
        );
    }

    #[test]
    fn escaped_tags_are_found_and_leading_whitespace_is_skipped() {
        let mut state = ThinkState::default();
        assert_eq!(
            phases(
                &mut state,
                &["\\n", "\\u003cthink\\u003e", "a\\u003c/think\\u003e"]
            ),
            [C, R, R]
        );
        assert!(state.is_settled());
    }

    #[test]
    fn a_closing_tag_alone_is_content_and_an_unclosed_one_stays_reasoning() {
        let mut state = ThinkState::default();
        assert_eq!(
            phases(&mut state, &["</think>", "Hi", "<think>"]),
            [C, C, C]
        );
        let mut state = ThinkState::default();
        assert_eq!(
            phases(&mut state, &["<think>", "a", "b</thin", "k"]),
            [R, R, R, R]
        );
        assert!(!state.is_settled());
    }

    #[test]
    fn a_route_may_open_the_thinking_in_the_prompt_and_name_its_own_tags() {
        let settings = ThinkSettings {
            tags: ThinkTags::new("<reason>", "</reason>").map(Arc::new),
            start: ThinkStart::Open,
        };
        let mut state = ThinkState::new(&settings);
        assert_eq!(
            phases(&mut state, &["plan", "</think>", "</reason>", "Answer"]),
            [R, R, R, C]
        );
        assert_eq!(ThinkTags::new("", "x"), None);
    }

    #[test]
    fn other_phases_pass_through_and_leave_the_tag_state() {
        let mut state = ThinkState::default();
        let reasoning = Classified {
            phase: R,
            ..content("<think>")
        };
        assert_eq!(state.phase(&reasoning), R);
        assert_eq!(phases(&mut state, &["Hello"]), [C]);
    }

    #[test]
    fn precedence_is_content_then_tool_call_then_reasoning() {
        assert_eq!(R.or_visible(T), T);
        assert_eq!(T.or_visible(C), C);
        assert_eq!(C.or_visible(R), C);
        assert_eq!(Phase::join(None, R), R);
    }

    #[test]
    fn a_mix_of_only_content_is_zero() {
        let mut mix = PhaseMix::ALL_CONTENT;
        mix.add(C, true);
        assert!(mix.is_all_content());
        mix.add(R, false);
        assert_eq!((mix.first(), mix.counts(3)), (C, [1, 2, 0]));
        assert_eq!(mix.main(3), Some(C));
    }

    proptest! {
        #[test]
        fn a_mix_counts_each_phase_of_a_frame(phases in prop::collection::vec(0usize..3, 1..200)) {
            let mut mix = PhaseMix::ALL_CONTENT;
            let mut want = [0u32; 3];
            for (i, p) in phases.iter().enumerate() {
                let phase = Phase::ALL[*p];
                if phase != C || i == 0 {
                    mix.add(phase, i == 0);
                }
                want[*p] += 1;
            }
            let total = phases.len() as u32;
            prop_assert_eq!(mix.counts(total), want);
            prop_assert_eq!(mix.first(), Phase::ALL[phases[0]]);
            prop_assert_eq!(mix.counts(total).iter().sum::<u32>(), total);
        }
    }
}
