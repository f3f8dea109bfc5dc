//! What one stream outputs, phase by phase: `R` reasoning tokens, the answer's `C` content tokens
//! and `N` tool calls of `A` argument tokens each, in that order, as a reasoning model or an agent
//! writes them.
//!
//! Tokens are numbered from 0 across the whole stream (reasoning `0..R`, content `R..R+C`, tool
//! call `k` at `R+C+k·A..R+C+(k+1)·A`), so a token's phase, the wire segment it belongs to and the
//! text it shows are pure functions of its number. The cadence never lets a decode step cross a
//! boundary between phases or tool calls, so every token event has exactly one phase: the truth a
//! measurement of phases is checked against.

use super::config::ThinkTags;

/// What a token event shows the reader: the model's thinking, the answer, or tool-call arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The model's thinking (a reasoning field, or text inside `<think>` … `</think>`).
    Reasoning,
    /// The answer text a person reads.
    Content,
    /// Tool-call arguments.
    ToolCall,
}

/// A stretch of the output that the wire formats open and close as a unit: a thinking block,
/// the text, one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Reasoning in a field or block of its own (a reasoning parser is on).
    Thinking,
    /// The text: the answer, and the thinking too when it travels inline in `<think>` tags.
    Text,
    /// Tool call `k` (from 0).
    ToolCall(u64),
}

/// The plan of one stream's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Output {
    /// Reasoning tokens, first.
    pub reasoning: u64,
    /// Answer tokens, after the reasoning.
    pub content: u64,
    /// Tool calls, after the answer.
    pub tool_calls: u64,
    /// Argument tokens of each tool call (at least 1).
    pub tool_call_tokens: u64,
    /// How the reasoning travels: in a field of its own, or inline in the text between tags.
    pub think_tags: ThinkTags,
}

// === impl Output ===

impl Output {
    /// An answer of `content` tokens and nothing else.
    #[cfg(test)]
    pub(crate) fn answer(content: u64) -> Self {
        Output {
            reasoning: 0,
            content,
            tool_calls: 0,
            tool_call_tokens: 1,
            think_tags: ThinkTags::Parser,
        }
    }

    /// Output tokens of the whole stream.
    pub(crate) fn total(&self) -> u64 {
        self.answer_start() + self.content + self.tool_tokens()
    }

    /// Tokens of all the tool calls together.
    pub(crate) fn tool_tokens(&self) -> u64 {
        self.tool_calls.saturating_mul(self.tool_call_tokens)
    }

    /// The first token that is not reasoning: where a think pause goes.
    pub(crate) fn answer_start(&self) -> u64 {
        self.reasoning
    }

    /// The first token of the tool calls.
    fn tools_start(&self) -> u64 {
        self.reasoning + self.content
    }

    /// The phase of token `token`.
    pub(crate) fn phase(&self, token: u64) -> Phase {
        if token < self.reasoning {
            Phase::Reasoning
        } else if token < self.tools_start() {
            Phase::Content
        } else {
            Phase::ToolCall
        }
    }

    /// Whether the reasoning has a segment of its own (a reasoning parser), rather than riding
    /// inline at the start of the text.
    pub(crate) fn has_thinking_segment(&self) -> bool {
        self.reasoning > 0 && self.think_tags == ThinkTags::Parser
    }

    /// The segment token `token` belongs to.
    pub(crate) fn segment(&self, token: u64) -> Segment {
        match self.phase(token) {
            Phase::Reasoning if self.has_thinking_segment() => Segment::Thinking,
            Phase::Reasoning | Phase::Content => Segment::Text,
            Phase::ToolCall => {
                Segment::ToolCall((token - self.tools_start()) / self.tool_call_tokens.max(1))
            }
        }
    }

    /// The tokens of `segment`.
    pub(crate) fn range(&self, segment: Segment) -> std::ops::Range<u64> {
        match segment {
            Segment::Thinking => 0..self.reasoning,
            Segment::Text if self.has_thinking_segment() => self.reasoning..self.tools_start(),
            Segment::Text => 0..self.tools_start(),
            Segment::ToolCall(k) => {
                let start = self.tools_start() + k * self.tool_call_tokens;
                start..start + self.tool_call_tokens
            }
        }
    }

    /// The segment's place among the stream's segments (Anthropic's block `index`, the
    /// Responses API's `output_index`).
    pub(crate) fn position(&self, segment: Segment) -> u64 {
        let thinking = u64::from(self.has_thinking_segment());
        match segment {
            Segment::Thinking => 0,
            Segment::Text => thinking,
            Segment::ToolCall(k) => thinking + 1 + k,
        }
    }

    /// The first segment of the stream.
    pub(crate) fn first_segment(&self) -> Segment {
        self.segment(0)
    }

    /// The last segment of the stream.
    pub(crate) fn last_segment(&self) -> Segment {
        self.segment(self.total().saturating_sub(1))
    }

    /// When token `token` opens a segment other than the first: the segment it closes and the
    /// one it opens.
    pub(crate) fn boundary_at(&self, token: u64) -> Option<(Segment, Segment)> {
        if token == 0 || token >= self.total() {
            return None;
        }
        let (before, at) = (self.segment(token - 1), self.segment(token));
        (before != at).then_some((before, at))
    }

    /// The end of the run of tokens that share token `token`'s phase and segment: a decode step
    /// starting at `token` ends there at the latest.
    pub(crate) fn run_end(&self, token: u64) -> u64 {
        let segment_end = self.range(self.segment(token)).end;
        let phase_end = match self.phase(token) {
            Phase::Reasoning => self.reasoning,
            Phase::Content => self.tools_start(),
            Phase::ToolCall => self.total(),
        };
        segment_end.min(phase_end).min(self.total())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(think_tags: ThinkTags) -> Output {
        Output {
            reasoning: 3,
            content: 4,
            tool_calls: 2,
            tool_call_tokens: 5,
            think_tags,
        }
    }

    #[test]
    fn tokens_run_reasoning_then_content_then_each_tool_call() {
        let o = agent(ThinkTags::Parser);
        assert_eq!(o.total(), 3 + 4 + 10);
        let phases: Vec<Phase> = (0..o.total()).map(|t| o.phase(t)).collect();
        assert_eq!(&phases[..3], [Phase::Reasoning; 3]);
        assert_eq!(&phases[3..7], [Phase::Content; 4]);
        assert_eq!(&phases[7..], [Phase::ToolCall; 10]);
        assert_eq!(o.segment(0), Segment::Thinking);
        assert_eq!(o.segment(3), Segment::Text);
        assert_eq!(o.segment(11), Segment::ToolCall(0));
        assert_eq!(o.segment(12), Segment::ToolCall(1));
        assert_eq!(o.range(Segment::ToolCall(1)), 12..17);
        assert_eq!(o.position(Segment::ToolCall(1)), 3);
    }

    #[test]
    fn runs_end_at_every_phase_and_call_boundary() {
        let o = agent(ThinkTags::Parser);
        assert_eq!(o.run_end(0), 3);
        assert_eq!(o.run_end(5), 7);
        assert_eq!(o.run_end(7), 12);
        assert_eq!(o.run_end(12), 17);
        let boundaries: Vec<u64> = (0..o.total())
            .filter(|t| o.boundary_at(*t).is_some())
            .collect();
        assert_eq!(boundaries, [3, 7, 12]);
        assert_eq!(
            o.boundary_at(7),
            Some((Segment::Text, Segment::ToolCall(0)))
        );
    }

    #[test]
    fn inline_thinking_shares_the_text_segment_but_keeps_its_phase() {
        let o = agent(ThinkTags::Inline);
        assert!(!o.has_thinking_segment());
        assert_eq!(o.segment(0), Segment::Text);
        assert_eq!(o.range(Segment::Text), 0..7);
        assert_eq!(o.phase(2), Phase::Reasoning);
        // The phase boundary still ends a run, so no step mixes thinking and answer.
        assert_eq!(o.run_end(0), 3);
        assert_eq!(o.boundary_at(3), None);
        assert_eq!(o.position(Segment::ToolCall(0)), 1);
    }

    #[test]
    fn a_plain_answer_is_one_text_segment() {
        let o = Output::answer(5);
        assert_eq!(o.first_segment(), Segment::Text);
        assert_eq!(o.last_segment(), Segment::Text);
        assert_eq!(o.run_end(0), 5);
        assert_eq!(o.answer_start(), 0);
    }
}
