//! Why a stream's generation ended: each API's own spelling folded into one bounded set.
//!
//! The `finish_reason` label of `metronome_streams_total` takes its value from here, so it must
//! stay bounded whatever a server sends: every spelling metronome does not know is `other`.
//! Each accountant reads its format's field only on the events that carry it (the last chunk,
//! `message_delta`, `response.completed` …) and maps the raw JSON text (quotes included, so
//! nothing is unescaped or copied) with one of the functions below.
//!
//! | format | field | spellings |
//! |---|---|---|
//! | OpenAI chat and completions | `choices[].finish_reason` | `stop`, `length`, `tool_calls`, `function_call`, `content_filter`, vLLM's `abort` and `error` |
//! | Anthropic | `message_delta.delta.stop_reason` | `end_turn`, `stop_sequence`, `pause_turn`, `max_tokens`, `model_context_window_exceeded`, `tool_use`, `refusal` |
//! | Gemini | `candidates[].finishReason` | `STOP`, `MAX_TOKENS`, `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`, `IMAGE_SAFETY`, `MALFORMED_FUNCTION_CALL`, `LANGUAGE`, `OTHER` |
//! | TGI | `details.finish_reason` | `eos_token`, `stop_sequence`, `length` |
//! | Ollama | `done_reason` | `stop`, `length`, `load`, `unload` |
//! | llama.cpp | `stop_type`, else `stopped_eos` / `stopped_word` / `stopped_limit` | `eos`, `word`, `limit` |
//! | SGLang | `meta_info.finish_reason.type` | `stop`, `length`, `abort` |
//! | Responses | `response.status`, `incomplete_details.reason` | `completed`, `incomplete` + `max_output_tokens` / `content_filter`, `failed`, `cancelled` |

/// Why generation ended, as the `finish_reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A natural end: the end-of-sequence token or a stop sequence.
    Stop,
    /// The token limit (`max_tokens`, the context window).
    Length,
    /// The model called a tool and waits for its result.
    ToolCalls,
    /// A safety or content filter ended (or blocked) the output.
    ContentFilter,
    /// The generation was cancelled: the server says so, or the client went away.
    Abort,
    /// The server failed mid-stream, or the proxy saw the upstream fail.
    Error,
    /// A reason the format reports that metronome does not know.
    Other,
}

// === impl FinishReason ===

impl FinishReason {
    /// Every reason, for the tests and the documentation.
    pub const ALL: [FinishReason; 7] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::ToolCalls,
        FinishReason::ContentFilter,
        FinishReason::Abort,
        FinishReason::Error,
        FinishReason::Other,
    ];

    /// The label value of a stream that ended without reporting a reason.
    pub const NONE_LABEL: &'static str = "none";

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
            FinishReason::Other => "other",
        }
    }

    /// The label of a stream's reason, `none` when it reported none.
    pub fn label_of(reason: Option<FinishReason>) -> &'static str {
        reason.map_or(Self::NONE_LABEL, Self::label)
    }

    /// OpenAI's `finish_reason` (and the OpenAI-compatible servers' extra spellings); `null`
    /// is no reason yet.
    pub fn openai(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" => return None,
            br#""stop""# => FinishReason::Stop,
            br#""length""# => FinishReason::Length,
            br#""tool_calls""# | br#""function_call""# => FinishReason::ToolCalls,
            br#""content_filter""# => FinishReason::ContentFilter,
            br#""abort""# | br#""cancelled""# => FinishReason::Abort,
            br#""error""# => FinishReason::Error,
            _ => FinishReason::Other,
        })
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" => return None,
            br#""end_turn""# | br#""stop_sequence""# | br#""pause_turn""# => FinishReason::Stop,
            br#""max_tokens""# | br#""model_context_window_exceeded""# => FinishReason::Length,
            br#""tool_use""# => FinishReason::ToolCalls,
            br#""refusal""# => FinishReason::ContentFilter,
            _ => FinishReason::Other,
        })
    }

    /// Gemini's `finishReason`; `FINISH_REASON_UNSPECIFIED` is no reason.
    pub fn gemini(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" | br#""FINISH_REASON_UNSPECIFIED""# => return None,
            br#""STOP""# => FinishReason::Stop,
            br#""MAX_TOKENS""# => FinishReason::Length,
            br#""SAFETY""#
            | br#""RECITATION""#
            | br#""BLOCKLIST""#
            | br#""PROHIBITED_CONTENT""#
            | br#""SPII""#
            | br#""IMAGE_SAFETY""# => FinishReason::ContentFilter,
            br#""MALFORMED_FUNCTION_CALL""# => FinishReason::Error,
            _ => FinishReason::Other,
        })
    }

    /// TGI's `details.finish_reason`.
    pub fn tgi(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" => return None,
            br#""eos_token""# | br#""stop_sequence""# => FinishReason::Stop,
            br#""length""# => FinishReason::Length,
            _ => FinishReason::Other,
        })
    }

    /// Ollama's `done_reason` (`load` and `unload` answer a request that generated nothing).
    pub fn ollama(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" => return None,
            br#""stop""# => FinishReason::Stop,
            br#""length""# => FinishReason::Length,
            _ => FinishReason::Other,
        })
    }

    /// llama.cpp's `stop_type` (`none` while it has not stopped).
    pub fn llamacpp(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" | br#""none""# => return None,
            br#""eos""# | br#""word""# => FinishReason::Stop,
            br#""limit""# => FinishReason::Length,
            _ => FinishReason::Other,
        })
    }

    /// SGLang's `meta_info.finish_reason.type`.
    pub fn sglang(raw: &[u8]) -> Option<FinishReason> {
        Some(match raw {
            b"null" => return None,
            br#""stop""# => FinishReason::Stop,
            br#""length""# => FinishReason::Length,
            br#""abort""# => FinishReason::Abort,
            _ => FinishReason::Other,
        })
    }

    /// The Responses API's final `response.status`, with `incomplete_details.reason` for an
    /// incomplete one; `in_progress` and `queued` are no reason yet.
    pub fn responses(status: &[u8], incomplete: Option<&[u8]>) -> Option<FinishReason> {
        Some(match status {
            b"null" | br#""in_progress""# | br#""queued""# => return None,
            br#""completed""# => FinishReason::Stop,
            br#""incomplete""# => match incomplete {
                Some(br#""max_output_tokens""#) => FinishReason::Length,
                Some(br#""content_filter""#) => FinishReason::ContentFilter,
                _ => FinishReason::Other,
            },
            br#""failed""# => FinishReason::Error,
            br#""cancelled""# => FinishReason::Abort,
            _ => FinishReason::Other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_distinct() {
        let mut labels: Vec<_> = FinishReason::ALL.iter().map(|r| r.label()).collect();
        labels.push(FinishReason::label_of(None));
        let count = labels.len();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), count);
        assert_eq!(FinishReason::label_of(Some(FinishReason::Length)), "length");
        assert_eq!(FinishReason::label_of(None), "none");
    }

    #[test]
    fn each_formats_spellings() {
        use FinishReason::*;
        assert_eq!(FinishReason::openai(br#""function_call""#), Some(ToolCalls));
        assert_eq!(
            FinishReason::openai(br#""content_filter""#),
            Some(ContentFilter)
        );
        assert_eq!(FinishReason::openai(br#""abort""#), Some(Abort));
        assert_eq!(FinishReason::openai(br#""st\u006fp""#), Some(Other));
        assert_eq!(FinishReason::openai(b"null"), None);
        assert_eq!(FinishReason::anthropic(br#""end_turn""#), Some(Stop));
        assert_eq!(FinishReason::anthropic(br#""max_tokens""#), Some(Length));
        assert_eq!(FinishReason::anthropic(br#""tool_use""#), Some(ToolCalls));
        assert_eq!(
            FinishReason::anthropic(br#""refusal""#),
            Some(ContentFilter)
        );
        assert_eq!(FinishReason::gemini(br#""MAX_TOKENS""#), Some(Length));
        assert_eq!(FinishReason::gemini(br#""SAFETY""#), Some(ContentFilter));
        assert_eq!(
            FinishReason::gemini(br#""FINISH_REASON_UNSPECIFIED""#),
            None
        );
        assert_eq!(FinishReason::tgi(br#""eos_token""#), Some(Stop));
        assert_eq!(FinishReason::tgi(br#""length""#), Some(Length));
        assert_eq!(FinishReason::ollama(br#""length""#), Some(Length));
        assert_eq!(FinishReason::ollama(br#""unload""#), Some(Other));
        assert_eq!(FinishReason::llamacpp(br#""limit""#), Some(Length));
        assert_eq!(FinishReason::llamacpp(br#""none""#), None);
        assert_eq!(FinishReason::sglang(br#""abort""#), Some(Abort));
        let incomplete =
            |reason: &'static [u8]| FinishReason::responses(br#""incomplete""#, Some(reason));
        assert_eq!(incomplete(br#""max_output_tokens""#), Some(Length));
        assert_eq!(incomplete(br#""content_filter""#), Some(ContentFilter));
        assert_eq!(FinishReason::responses(br#""completed""#, None), Some(Stop));
        assert_eq!(FinishReason::responses(br#""in_progress""#, None), None);
        assert_eq!(FinishReason::responses(br#""failed""#, None), Some(Error));
    }
}
