//! Token accounting: which events of a stream carry output the reader sees, and how many tokens.
//!
//! A gap is only meaningful between events that show the reader something, so each streaming API
//! gets an accountant that classifies its events. The OpenAI-compatible one (vLLM, SGLang,
//! llama.cpp `/v1`, TGI `/v1`, Ollama `/v1`, OpenAI) lives here; other APIs plug in as further
//! [`Accounting`] variants. Classifying borrows from the event and never allocates.

pub mod openai;

use crate::scan::Event;

pub use openai::OpenAiAccounting;

/// What one event means for the stream's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classified<'a> {
    /// The event shows the reader output (text, reasoning, tool-call arguments).
    pub token_event: bool,
    /// Exact tokens this event carries, where the format says so; otherwise a token event is 1.
    pub tokens: Option<u32>,
    /// The stream's output-token total so far as the server reports it (`usage`), when present.
    pub usage_total: Option<u64>,
    /// The model the event names, when it names one (borrowed, without JSON escapes).
    pub model: Option<&'a str>,
    /// The event is the format's end marker (`[DONE]` and its kin).
    pub end: bool,
    /// The event reports an error from the server mid-stream.
    pub error: bool,
    /// The event could not be parsed (invalid JSON, or too long to inspect).
    pub unparsed: bool,
}

/// The accountant chosen for one stream.
#[derive(Debug)]
pub enum Accounting {
    /// OpenAI-compatible chat and completions chunks.
    OpenAi(OpenAiAccounting),
}

// === impl Accounting ===

impl Accounting {
    /// The accountant for an OpenAI-compatible stream.
    pub fn openai() -> Self {
        Accounting::OpenAi(OpenAiAccounting::default())
    }

    /// Classifies one event.
    #[inline]
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        match self {
            Accounting::OpenAi(a) => a.classify(event),
        }
    }

    /// The format's name, as operators see it in logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Accounting::OpenAi(_) => "openai",
        }
    }
}
