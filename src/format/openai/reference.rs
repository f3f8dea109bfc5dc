//! The reference reader: serde, borrowing every field; it has the last word on what the
//! template and the walker decline.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Summary;
use crate::format::json::{is_literal, non_empty_string, plain_string, present, ArrayLen};
use crate::format::{FinishReason, Phase};

// === impl Summary ===

impl<'a> Summary<'a> {
    /// The reference reader: serde, borrowing every field. `None` when the chunk is not valid.
    pub(super) fn by_serde(data: &'a [u8]) -> Option<Self> {
        let chunk = serde_json::from_slice::<Chunk<'a>>(data).ok()?;
        Some(Summary {
            model: chunk.model.and_then(plain_string),
            error: present(chunk.error) || is_literal(chunk.object, r#""error""#),
            token_event: chunk.choices.phase.is_some(),
            phase: chunk.choices.phase.unwrap_or_default(),
            text: chunk.choices.text,
            token_ids: chunk.choices.token_ids,
            usage_total: chunk.usage.and_then(|u| u.completion_tokens),
            finish: chunk.choices.finish,
        })
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: ChoicesSummary<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// `usage.prompt_tokens` and `usage.completion_tokens_details.reasoning_tokens` of a chunk, each
/// when it is a plain unsigned integer.
pub(in crate::format) fn usage_details_by_serde(data: &[u8]) -> (Option<u64>, Option<u64>) {
    #[derive(Deserialize)]
    struct UsageChunk {
        #[serde(default)]
        usage: Option<DetailedUsage>,
    }
    #[derive(Deserialize)]
    struct DetailedUsage {
        #[serde(default)]
        prompt_tokens: Option<u64>,
        #[serde(default)]
        completion_tokens_details: Option<CompletionDetails>,
    }
    #[derive(Deserialize)]
    struct CompletionDetails {
        #[serde(default)]
        reasoning_tokens: Option<u64>,
    }
    let Some(usage) = serde_json::from_slice::<UsageChunk>(data)
        .ok()
        .and_then(|c| c.usage)
    else {
        return (None, None);
    };
    let reasoning = usage
        .completion_tokens_details
        .and_then(|d| d.reasoning_tokens);
    (usage.prompt_tokens, reasoning)
}

/// The `choices` array folded to what matters, without collecting it.
#[derive(Default)]
struct ChoicesSummary<'a> {
    /// The phase of the output the choices show, when some choice shows any.
    phase: Option<Phase>,
    /// The raw inside of the last non-empty content or `text` string.
    text: Option<&'a [u8]>,
    /// The `token_ids` of all choices together, when any choice has them.
    token_ids: Option<u32>,
    /// The last `finish_reason` of the choices that have one.
    finish: Option<FinishReason>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ChoicesSummary<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ChoicesVisitor<'a> {
            type Value = ChoicesSummary<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ChoicesSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = ChoicesSummary::default();
                while let Some(choice) = seq.next_element::<Choice<'de>>()? {
                    if let Some(phase) = choice.phase() {
                        summary.phase = Some(Phase::join(summary.phase, phase));
                    }
                    if let Some(text) = choice.content_text() {
                        summary.text = Some(text);
                    }
                    let finish = choice.finish_reason.map(|r| r.get().as_bytes());
                    summary.finish = finish.and_then(FinishReason::openai).or(summary.finish);
                    if let Some(n) = choice.token_ids.0 {
                        summary.token_ids = Some(summary.token_ids.unwrap_or(0).saturating_add(n));
                    }
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(ChoicesVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    /// vLLM's `return_token_ids`: the ids of the tokens this choice's delta carries.
    #[serde(default)]
    token_ids: ArrayLen,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

impl<'a> Choice<'a> {
    /// The phase of the output the choice shows, when it shows any.
    fn phase(&self) -> Option<Phase> {
        if non_empty_string(self.text) {
            return Some(Phase::Content);
        }
        self.delta.as_ref().and_then(Delta::phase)
    }

    /// The raw inside of its non-empty content (or completions `text`).
    fn content_text(&self) -> Option<&'a [u8]> {
        let raw = Some(self.text)
            .filter(|t| non_empty_string(*t))
            .or_else(|| self.delta.as_ref().map(|d| d.content))
            .filter(|t| non_empty_string(*t))??;
        let raw = raw.get().as_bytes();
        Some(&raw[1..raw.len() - 1])
    }
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(default)]
    tool_calls: ToolCallsSummary,
}

impl Delta<'_> {
    /// The phase of the output the delta shows (content before tool_call before reasoning).
    fn phase(&self) -> Option<Phase> {
        if non_empty_string(self.content) {
            Some(Phase::Content)
        } else if self.tool_calls.has_arguments {
            Some(Phase::ToolCall)
        } else if non_empty_string(self.reasoning_content) || non_empty_string(self.reasoning) {
            Some(Phase::Reasoning)
        } else {
            None
        }
    }
}

/// `delta.tool_calls` folded to "does any call carry argument text".
#[derive(Default)]
struct ToolCallsSummary {
    has_arguments: bool,
}

impl<'de> Deserialize<'de> for ToolCallsSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CallsVisitor;
        impl<'de> Visitor<'de> for CallsVisitor {
            type Value = ToolCallsSummary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of tool calls")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ToolCallsSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = ToolCallsSummary::default();
                while let Some(call) = seq.next_element::<ToolCall<'de>>()? {
                    summary.has_arguments |= call
                        .function
                        .as_ref()
                        .is_some_and(|f| non_empty_string(f.arguments));
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(CallsVisitor)
    }
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}
