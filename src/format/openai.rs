//! OpenAI-compatible streaming chunks (`chat.completion.chunk` and `text_completion`).
//!
//! A token event is a chunk in which some choice carries non-empty `delta.content`,
//! `delta.reasoning_content` / `delta.reasoning`, tool-call `arguments`, or (completions) `text`.
//! Role-only and empty deltas (vLLM sends empty `content` for special tokens and for bytes held
//! back until they form valid UTF-8), finish chunks, usage-only chunks and `[DONE]` are not.
//! When vLLM or SGLang send continuous usage stats, the growth of `usage.completion_tokens` since
//! the previous token event is that event's exact token count. When vLLM returns `token_ids`
//! (`return_token_ids`), their number is the exact count of the event, and ids on an event that
//! shows nothing (a held-back byte, a special token) count toward the total only.
//! A choice's `finish_reason` (`stop`, `length`, `tool_calls`, `content_filter`, vLLM's `abort`)
//! is read by both readers as they pass it; the template path never sees one, since the chunk
//! that carries it differs from the template in more than its text.
//! `[DONE]` (with or without a space after `data:`) ends the stream; `{"error": ...}` or
//! `{"object": "error"}` mid-stream is an upstream error.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::RunningCount;
use super::json::{is_literal, non_empty_string, plain_string, present, ArrayLen};
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// Per-stream state of the OpenAI-compatible accountant.
#[derive(Debug, Default, Clone)]
pub struct OpenAiAccounting {
    /// `usage.completion_tokens` at the previous token event, for exact per-event counts.
    usage: RunningCount,
    /// The last token event the walker read, to read the next ones by comparison (boxed: made
    /// at the stream's first token event, and most accountants' state is a few words).
    template: Option<Box<fast::Template>>,
}

// === impl OpenAiAccounting ===

impl OpenAiAccounting {
    /// Asks for the cache lines of the kept template: the next chunk is compared with its bytes.
    #[inline]
    pub fn prefetch(&self) {
        if let Some(template) = &self.template {
            template.prefetch();
        }
    }

    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        let data = event.data.trim_ascii();
        if data == b"[DONE]" {
            return Classified {
                end: true,
                ..Classified::default()
            };
        }
        if event.truncated {
            return Classified {
                unparsed: true,
                ..Classified::default()
            };
        }
        // A chunk that differs from the previous token event only in its text reads as that one
        // did; the walker reads the usual chunk in one pass; anything it is not sure to read
        // exactly as serde does goes to serde, which has the last word.
        let template = self.template.as_deref().and_then(|t| t.read(data));
        let Some(chunk) = template
            .or_else(|| self.walk(data))
            .or_else(|| Summary::by_serde(data))
        else {
            return Classified {
                unparsed: true,
                ..Classified::default()
            };
        };
        let usage_total = chunk.usage_total;
        let token_event = chunk.token_event;
        let mut tokens = chunk.token_ids.filter(|n| *n > 0);
        if token_event {
            if let Some(now) = usage_total {
                let grew = self.usage.token_event(now);
                tokens = tokens.or(grew);
            }
        }
        // The prompt's and the reasoning tokens come with the usage chunk at the end (once per
        // stream): read by serde there only, so the per-token readers stay as they are.
        let (usage_prompt, usage_reasoning) = match usage_total {
            Some(_) if !token_event => usage_details_by_serde(data),
            _ => (None, None),
        };
        Classified {
            token_event,
            phase: chunk.phase,
            text: chunk.text,
            tokens,
            usage_total,
            usage_prompt,
            usage_reasoning,
            finish: chunk.finish,
            model: chunk.model,
            end: false,
            error: chunk.error,
            unparsed: false,
        }
    }

    /// The walker's reading of `data`; a token event it read becomes the template.
    fn walk<'a>(&mut self, data: &'a [u8]) -> Option<Summary<'a>> {
        let (summary, text) = fast::summary_and_text(data)?;
        if let Some(text) = text {
            match &mut self.template {
                Some(template) => template.keep(data, text, &summary),
                None => self.template = Some(Box::new(fast::Template::new(data, text, &summary))),
            }
        }
        Some(summary)
    }
}

/// What a chunk says, as either reader finds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Summary<'a> {
    /// `model`, when it is a string without escapes.
    model: Option<&'a str>,
    /// A non-null `error`, or `"object": "error"`.
    error: bool,
    /// Some choice shows the reader output.
    token_event: bool,
    /// The phase of a token event (content before tool_call before reasoning over the choices).
    phase: Phase,
    /// The raw inside of the last non-empty content (or completions `text`) string.
    text: Option<&'a [u8]>,
    /// The `token_ids` of all choices together, when any choice has them.
    token_ids: Option<u32>,
    /// `usage.completion_tokens`.
    usage_total: Option<u64>,
    /// The last `finish_reason` of the choices that have one.
    finish: Option<FinishReason>,
}

// === impl Summary ===

impl<'a> Summary<'a> {
    /// The reference reader: serde, borrowing every field. `None` when the chunk is not valid.
    fn by_serde(data: &'a [u8]) -> Option<Self> {
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
pub(super) fn usage_details_by_serde(data: &[u8]) -> (Option<u64>, Option<u64>) {
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

/// A one-pass reader of OpenAI chunks, for the hot path.
///
/// serde's derived readers are exact but cost about 5,000 instructions on a typical 230-byte chunk
/// (a visitor per field, UTF-8 checks per borrowed value); this walker reads the same fields in
/// one pass over the bytes. It accepts exactly the JSON grammar serde_json accepts (strings with
/// their escapes, numbers, literals, whitespace, no trailing commas) and returns `None` for
/// anything it is not sure to read as serde would: escaped or repeated field names, a field of an
/// unexpected type, a number that is not a plain unsigned integer where one is read, deep nesting,
/// invalid UTF-8 anywhere, a non-object. `None` sends the chunk to serde, so the result is always
/// serde's; the property test below checks that where the walker answers, serde agrees.
mod fast {
    use std::mem::replace;

    use super::{FinishReason, Phase, Summary};

    /// Nesting the walker follows; deeper chunks go to serde (whose own limit is 128).
    const MAX_DEPTH: u32 = 64;

    /// The chunk's summary, or `None` to leave it to serde.
    #[cfg(test)]
    pub(super) fn summary(data: &[u8]) -> Option<Summary<'_>> {
        summary_and_text(data).map(|(summary, _)| summary)
    }

    /// The chunk's summary and, when it is a token event, the raw span of a non-empty text value
    /// that makes it one (the last such); `None` to leave the chunk to serde.
    pub(super) fn summary_and_text(data: &[u8]) -> Option<(Summary<'_>, Option<Span>)> {
        // serde checks the UTF-8 of the values it borrows; checking all of it is a superset, and a
        // chunk that fails goes to serde.
        let text = std::str::from_utf8(data).ok()?;
        let mut walker = Walker {
            text,
            bytes: data,
            at: 0,
            depth: 0,
            content: None,
            other: None,
            phase: None,
        };
        let mut summary = walker.chunk()?;
        walker.whitespace();
        if walker.at != data.len() {
            return None;
        }
        summary.token_event = walker.phase.is_some();
        summary.phase = walker.phase.unwrap_or_default();
        summary.text = walker.content.map(|(start, end)| &data[start + 1..end - 1]);
        Some((summary, walker.content.or(walker.other)))
    }

    /// A raw value's place in the chunk: `start..end`.
    pub(super) type Span = (usize, usize);

    struct Walker<'a> {
        text: &'a str,
        bytes: &'a [u8],
        at: usize,
        depth: u32,
        /// The raw span of the last non-empty `content` or `text` string read.
        content: Option<Span>,
        /// The raw span of the last non-empty `reasoning_content` or `reasoning` string read.
        other: Option<Span>,
        /// The phase of the output read so far (content before tool_call before reasoning).
        phase: Option<Phase>,
    }

    /// The last token event the walker read, kept to read the stream's next chunks by comparison.
    ///
    /// A server streams one chunk shape over and over: the same id, timestamps and model, only the
    /// text differs. A chunk that is the template's bytes with one non-empty text value replaced
    /// by another tokenizes as the template did, token for token, the one string aside: the bytes
    /// before the string are the same, the new string is checked by the walker's own string rules
    /// (escapes, control characters, UTF-8) to close exactly where the template's bytes resume,
    /// and the parse after a string depends only on what came before it. Every field the summary
    /// reads is the same but that string, and it reads only whether the string is empty, which
    /// neither is. So the summary is the template's: a comparison of about 200 bytes instead of a
    /// walk over them. Anything else (another shape, a changed number, an empty text) is walked.
    #[derive(Debug, Clone)]
    pub(super) struct Template {
        bytes: Vec<u8>,
        /// The text value's raw span in `bytes`, quotes included.
        text: Span,
        /// The summary's `model` as a span of `bytes`, and its other fields.
        model: Option<Span>,
        error: bool,
        token_ids: Option<u32>,
        usage_total: Option<u64>,
        finish: Option<FinishReason>,
        /// The chunk's phase: every field but the text is the template's, so it is too.
        phase: Phase,
        /// The text value is the chunk's content, lent to the no-parser shape.
        text_is_content: bool,
    }

    /// How much of a template [`Template::prefetch`] asks for. A chunk is usually a few hundred
    /// bytes; one of many KiB (long logprobs, a large tool call) is compared from its start, so the
    /// processor's own prefetcher follows the read after the first lines, and asking for all of
    /// it ahead would cost a prefetch per 64 bytes, twice per frame, for lines the first-level
    /// cache cannot hold anyway.
    const PREFETCH_BYTES: usize = 1024;

    // === impl Template ===

    impl Template {
        /// Asks for the template's own line and its bytes' first [`PREFETCH_BYTES`] (see
        /// [`crate::prefetch`]).
        #[inline]
        pub(super) fn prefetch(&self) {
            crate::prefetch::value(self);
            crate::prefetch::slice(&self.bytes[..self.bytes.len().min(PREFETCH_BYTES)]);
        }

        /// A template of `data`, whose walk gave `summary` with the text value at `text`.
        pub(super) fn new(data: &[u8], text: Span, summary: &Summary<'_>) -> Self {
            let mut template = Template {
                bytes: Vec::new(),
                text,
                model: None,
                error: false,
                token_ids: None,
                usage_total: None,
                finish: None,
                phase: Phase::Content,
                text_is_content: false,
            };
            template.keep(data, text, summary);
            template
        }

        /// Makes `data` the template, reusing the buffer.
        pub(super) fn keep(&mut self, data: &[u8], text: Span, summary: &Summary<'_>) {
            debug_assert!(summary.token_event && non_empty_string(&data[text.0..text.1]));
            self.bytes.clear();
            self.bytes.extend_from_slice(data);
            self.text = text;
            self.model = summary.model.map(|model| {
                let start = model.as_ptr() as usize - data.as_ptr() as usize;
                (start, start + model.len())
            });
            self.error = summary.error;
            self.token_ids = summary.token_ids;
            self.usage_total = summary.usage_total;
            self.finish = summary.finish;
            self.phase = summary.phase;
            self.text_is_content = summary
                .text
                .is_some_and(|t| t.as_ptr() as usize - data.as_ptr() as usize == text.0 + 1);
        }

        /// `data`'s summary, when `data` is the template with another non-empty text.
        pub(super) fn read<'a>(&self, data: &'a [u8]) -> Option<Summary<'a>> {
            let (open, end) = self.text;
            let head = &self.bytes[..=open];
            let tail = &self.bytes[end - 1..];
            if data.len() <= head.len() + tail.len()
                || !data.starts_with(head)
                || !data.ends_with(tail)
            {
                return None;
            }
            let close = data.len() - tail.len();
            if string_close(data, open)? != close {
                return None; // the new text ends early, or escapes the closing quote
            }
            // A token's text is most often ASCII, which is valid UTF-8 and cheaper to check.
            let text = &data[open + 1..close];
            if !text.is_ascii() {
                std::str::from_utf8(text).ok()?;
            }
            let model = self.model.and_then(|(start, end)| {
                // The model is before the text or after it, never inside it.
                // After it, the model is as far from the end as in the template.
                let span = if start > open {
                    let at = |i: usize| data.len() - (self.bytes.len() - i);
                    at(start)..at(end)
                } else {
                    start..end
                };
                let model = &data[span];
                debug_assert_eq!(model, &self.bytes[start..end]);
                // Byte for byte the template's model, which was valid UTF-8 when it was kept; the
                // check is kept anyway (no `unsafe` for a 20-byte name): ASCII, the common case,
                // passes std's fast path.
                std::str::from_utf8(model).ok()
            });
            Some(Summary {
                model,
                error: self.error,
                token_event: true,
                phase: self.phase,
                text: self.text_is_content.then_some(text),
                token_ids: self.token_ids,
                usage_total: self.usage_total,
                finish: self.finish,
            })
        }
    }

    /// The index of the closing quote of the string whose opening quote is at `open`, by the
    /// walker's string rules; `None` if the string is not valid or does not close.
    fn string_close(bytes: &[u8], open: usize) -> Option<usize> {
        scan_string(bytes, open + 1).map(|(close, _)| close)
    }

    /// Reads string contents from `start`: the index of the closing quote and whether there were
    /// escapes. Escapes are checked as serde_json checks them; a control character is refused.
    fn scan_string(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
        let mut i = start;
        let mut escaped = false;
        loop {
            // Eight bytes at a time up to the first that ends or escapes the string or is a
            // control character: most of a chunk is the inside of strings.
            if let Some(word) = bytes.get(i..i + 8) {
                let special = specials(u64::from_le_bytes(word.try_into().ok()?));
                if special == 0 {
                    i += 8;
                    continue;
                }
                i += (special.trailing_zeros() / 8) as usize;
            }
            match *bytes.get(i)? {
                b'"' => return Some((i, escaped)),
                b'\\' => {
                    escaped = true;
                    match *bytes.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let hex = bytes.get(i + 2..i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => i += 1,
            }
        }
    }

    // === impl Walker ===

    impl<'a> Walker<'a> {
        fn whitespace(&mut self) {
            while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
                self.at += 1;
            }
        }

        /// The next byte after whitespace, not consumed.
        fn peek(&mut self) -> Option<u8> {
            self.whitespace();
            self.bytes.get(self.at).copied()
        }

        fn expect(&mut self, byte: u8) -> Option<()> {
            (self.peek()? == byte).then(|| self.at += 1)
        }

        fn literal(&mut self, literal: &[u8]) -> Option<()> {
            let end = self.at + literal.len();
            (self.bytes.get(self.at..end)? == literal).then(|| self.at = end)
        }

        /// A string whose opening quote is next: its contents' span and whether it has escapes.
        fn string(&mut self) -> Option<(Span, bool)> {
            let start = self.at + 1;
            let (close, escaped) = scan_string(self.bytes, start)?;
            self.at = close + 1;
            Some(((start, close), escaped))
        }

        /// A number, by the JSON grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
        fn number(&mut self) -> Option<()> {
            let b = self.bytes;
            let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
            let mut i = self.at;
            if b.get(i) == Some(&b'-') {
                i += 1;
            }
            match *b.get(i)? {
                b'0' => {
                    i += 1;
                    if digit(i) {
                        return None;
                    }
                }
                b'1'..=b'9' => {
                    while digit(i) {
                        i += 1;
                    }
                }
                _ => return None,
            }
            if b.get(i) == Some(&b'.') {
                i += 1;
                let first = i;
                while digit(i) {
                    i += 1;
                }
                if i == first {
                    return None;
                }
            }
            if let Some(b'e' | b'E') = b.get(i) {
                i += 1;
                if let Some(b'+' | b'-') = b.get(i) {
                    i += 1;
                }
                let first = i;
                while digit(i) {
                    i += 1;
                }
                if i == first {
                    return None;
                }
            }
            self.at = i;
            Some(())
        }

        /// Any value, skipped; its span.
        fn value(&mut self) -> Option<Span> {
            let first = self.peek()?;
            let start = self.at;
            match first {
                b'"' => {
                    self.string()?;
                }
                b'{' => self.object(|w, _| w.value().map(drop))?,
                b'[' => self.array(|w| w.value().map(drop))?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            Some((start, self.at))
        }

        /// An `Option<&RawValue>`: `null` is `None`, anything else its span.
        fn optional(&mut self) -> Option<Option<Span>> {
            if self.peek()? == b'n' {
                self.literal(b"null")?;
                return Some(None);
            }
            self.value().map(Some)
        }

        /// `null`, or else an object read by `read`, or else not for the walker.
        fn null_or_object(&mut self, read: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
            match self.peek()? {
                b'n' => self.literal(b"null"),
                b'{' => read(self),
                _ => None,
            }
        }

        /// `null`, or else an array whose elements `element` reads, or else not for the walker.
        fn null_or_array(&mut self, element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
            match self.peek()? {
                b'n' => self.literal(b"null"),
                b'[' => self.array(element),
                _ => None,
            }
        }

        /// An object: `member` gets each field name (without escapes) and reads its value.
        fn object(
            &mut self,
            mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
        ) -> Option<()> {
            self.expect(b'{')?;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return None;
            }
            if self.peek()? == b'}' {
                self.at += 1;
                self.depth -= 1;
                return Some(());
            }
            loop {
                if self.peek()? != b'"' {
                    return None;
                }
                let ((start, end), escaped) = self.string()?;
                if escaped {
                    return None;
                }
                self.expect(b':')?;
                let bytes = self.bytes;
                member(self, &bytes[start..end])?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        self.depth -= 1;
                        return Some(());
                    }
                    _ => return None,
                }
            }
        }

        /// An array: `element` reads each element.
        fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
            self.expect(b'[')?;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return None;
            }
            if self.peek()? == b']' {
                self.at += 1;
                self.depth -= 1;
                return Some(());
            }
            loop {
                element(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => {
                        self.at += 1;
                        self.depth -= 1;
                        return Some(());
                    }
                    _ => return None,
                }
            }
        }

        fn raw(&self, (start, end): Span) -> &'a [u8] {
            &self.bytes[start..end]
        }

        /// Whether the text value at `span` shows output (a non-empty string) of `phase`;
        /// remembers it if so.
        fn text(&mut self, span: Span, phase: Phase) -> bool {
            let shows = non_empty_string(self.raw(span));
            if shows {
                self.shows(phase);
                match phase {
                    Phase::Content => self.content = Some(span),
                    _ => self.other = Some(span),
                }
            }
            shows
        }

        /// The chunk shows output of `phase`.
        fn shows(&mut self, phase: Phase) {
            self.phase = Some(Phase::join(self.phase, phase));
        }

        /// The top-level chunk; fields as in `Chunk`.
        fn chunk(&mut self) -> Option<Summary<'a>> {
            if self.peek()? != b'{' {
                return None; // serde also reads a struct from an array
            }
            let mut s = Summary::default();
            let mut seen = [false; 5];
            let text = self.text;
            self.object(|w, name| {
                let field = match name {
                    b"model" => 0,
                    b"object" => 1,
                    b"error" => 2,
                    b"choices" => 3,
                    b"usage" => 4,
                    _ => return w.value().map(drop),
                };
                if replace(&mut seen[field], true) {
                    return None; // serde refuses a repeated field
                }
                match field {
                    0 => {
                        if let Some((start, end)) = w.optional()? {
                            s.model = plain_string(text.get(start..end)?);
                        }
                    }
                    1 => {
                        if let Some(span) = w.optional()? {
                            s.error |= w.raw(span) == br#""error""#;
                        }
                    }
                    2 => s.error |= w.optional()?.is_some(),
                    3 => w.null_or_array(|w| {
                        let (shows, ids, finish) = w.choice()?;
                        s.token_event |= shows;
                        if let Some(n) = ids {
                            s.token_ids = Some(s.token_ids.unwrap_or(0).saturating_add(n));
                        }
                        s.finish = finish.or(s.finish);
                        Some(())
                    })?,
                    _ => w.null_or_object(|w| {
                        s.usage_total = w.usage()?;
                        Some(())
                    })?,
                }
                Some(())
            })?;
            Some(s)
        }

        /// One element of `choices`: whether it shows output, its `token_ids` count and its
        /// `finish_reason`.
        fn choice(&mut self) -> Option<(bool, Option<u32>, Option<FinishReason>)> {
            if self.peek()? != b'{' {
                return None;
            }
            let mut seen = [false; 4];
            let (mut shows, mut ids, mut finish) = (false, None, None);
            self.object(|w, name| {
                let field = match name {
                    b"delta" => 0,
                    b"text" => 1,
                    b"token_ids" => 2,
                    b"finish_reason" => 3,
                    _ => return w.value().map(drop),
                };
                if replace(&mut seen[field], true) {
                    return None;
                }
                match field {
                    0 => w.null_or_object(|w| {
                        shows |= w.delta()?;
                        Some(())
                    })?,
                    1 => {
                        if let Some(span) = w.optional()? {
                            shows |= w.text(span, Phase::Content);
                        }
                    }
                    3 => {
                        if let Some(span) = w.optional()? {
                            finish = FinishReason::openai(w.raw(span));
                        }
                    }
                    _ => {
                        if w.peek()? == b'[' {
                            let mut n: u32 = 0;
                            w.array(|w| {
                                w.value()?;
                                n = n.saturating_add(1);
                                Some(())
                            })?;
                            ids = Some(n);
                        } else {
                            w.null_or_array(|_| None)?;
                        }
                    }
                }
                Some(())
            })?;
            Some((shows, ids, finish))
        }

        /// A `delta`: whether it shows output.
        fn delta(&mut self) -> Option<bool> {
            let mut seen = [false; 4];
            let mut shows = false;
            self.object(|w, name| {
                let field = match name {
                    b"content" => 0,
                    b"reasoning_content" => 1,
                    b"reasoning" => 2,
                    b"tool_calls" => 3,
                    _ => return w.value().map(drop),
                };
                if replace(&mut seen[field], true) {
                    return None;
                }
                if field < 3 {
                    if let Some(span) = w.optional()? {
                        let phase = if field == 0 {
                            Phase::Content
                        } else {
                            Phase::Reasoning
                        };
                        shows |= w.text(span, phase);
                    }
                    return Some(());
                }
                w.null_or_array(|w| {
                    if w.peek()? != b'{' {
                        return None;
                    }
                    let arguments = w.tool_call()?;
                    if arguments {
                        w.shows(Phase::ToolCall);
                    }
                    shows |= arguments;
                    Some(())
                })
            })?;
            Some(shows)
        }

        /// One tool call: whether its `function.arguments` has text.
        fn tool_call(&mut self) -> Option<bool> {
            let (mut seen, mut arguments) = (false, false);
            self.object(|w, name| {
                if name != b"function" {
                    return w.value().map(drop);
                }
                if replace(&mut seen, true) {
                    return None;
                }
                w.null_or_object(|w| {
                    arguments = w.function()?;
                    Some(())
                })
            })?;
            Some(arguments)
        }

        /// A tool call's `function`: whether `arguments` has text.
        fn function(&mut self) -> Option<bool> {
            let (mut seen, mut arguments) = (false, false);
            self.object(|w, name| {
                if name != b"arguments" {
                    return w.value().map(drop);
                }
                if replace(&mut seen, true) {
                    return None;
                }
                if let Some(span) = w.optional()? {
                    arguments = non_empty_string(w.raw(span));
                }
                Some(())
            })?;
            Some(arguments)
        }

        /// `usage`: its `completion_tokens`, when a plain unsigned integer (or null / absent).
        fn usage(&mut self) -> Option<Option<u64>> {
            let (mut seen, mut total) = (false, None);
            self.object(|w, name| {
                if name != b"completion_tokens" {
                    return w.value().map(drop);
                }
                if replace(&mut seen, true) {
                    return None;
                }
                if let Some(span) = w.optional()? {
                    let digits = w.raw(span);
                    if !digits.iter().all(u8::is_ascii_digit) {
                        return None; // a sign, fraction or exponent: serde decides
                    }
                    total = Some(std::str::from_utf8(digits).ok()?.parse::<u64>().ok()?);
                }
                Some(())
            })?;
            Some(total)
        }
    }

    /// The bytes of `word` (little-endian) that end or escape a string or are control
    /// characters, as the high bit of each: the classic zero-byte test on `word ^ '"'` and
    /// `word ^ '\\'`, and the less-than test on `word < 0x20`. Borrows only run upwards, so the
    /// lowest bit set marks the first such byte exactly (higher ones may be false alarms).
    fn specials(word: u64) -> u64 {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let zero = |v: u64| v.wrapping_sub(ONES) & !v;
        let quote = zero(word ^ (ONES * u64::from(b'"')));
        let backslash = zero(word ^ (ONES * u64::from(b'\\')));
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        (quote | backslash | control) & HIGH
    }

    /// As `json::plain_string` on the raw text: a string without escapes, unquoted.
    fn plain_string(raw: &str) -> Option<&str> {
        let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
        (!inner.contains('\\')).then_some(inner)
    }

    /// As `json::non_empty_string` on the raw text.
    fn non_empty_string(raw: &[u8]) -> bool {
        raw.len() > 2 && raw[0] == b'"'
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(acc: &mut OpenAiAccounting, data: &str) -> Classified<'static> {
        let data: &'static [u8] = Box::leak(data.as_bytes().to_vec().into_boxed_slice());
        acc.classify(&Event {
            kind: b"",
            data,
            truncated: false,
        })
    }

    #[test]
    fn chat_chunks_from_vllm() {
        let mut acc = OpenAiAccounting::default();
        let role = classify(
            &mut acc,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert!(!role.token_event);
        assert_eq!(role.model, Some("meta-llama/Llama-3.1-8B-Instruct"));
        let token = classify(
            &mut acc,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hello\n"},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert!(token.token_event);
        assert_eq!(token.tokens, None);
        let held_back = classify(
            &mut acc,
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#,
        );
        assert!(!held_back.token_event);
        let finish = classify(
            &mut acc,
            r#"{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        );
        assert!(!finish.token_event);
        let usage = classify(
            &mut acc,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}"#,
        );
        assert!(!usage.token_event);
        assert_eq!(usage.usage_total, Some(40));
        assert_eq!(usage.usage_prompt, Some(5));
        assert_eq!(finish.usage_prompt, None);
        assert_eq!(finish.finish, Some(FinishReason::Stop));
        assert_eq!(
            (role.finish, token.finish, usage.finish),
            (None, None, None)
        );
        assert!(classify(&mut acc, "[DONE]").end);
        assert!(classify(&mut acc, " [DONE]").end);
    }

    #[test]
    fn finish_reasons_as_each_reader_finds_them() {
        // vLLM's last token event carries its text and the reason together: the template
        // (kept from the chunk before) cannot vouch for it, so the walker reads it.
        let mut acc = OpenAiAccounting::default();
        let chunk = |content: &str, finish: &str| {
            format!(
                r#"{{"id":"chatcmpl-9","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":{finish}}}]}}"#
            )
        };
        assert_eq!(classify(&mut acc, &chunk("a", "null")).finish, None);
        assert_eq!(classify(&mut acc, &chunk("b", "null")).finish, None);
        let last = classify(&mut acc, &chunk("c", r#""length""#));
        assert!(last.token_event);
        assert_eq!(last.finish, Some(FinishReason::Length));
        for (data, reason) in [
            (
                r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}"#,
                FinishReason::ToolCalls,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}"#,
                FinishReason::ToolCalls,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
                FinishReason::ContentFilter,
            ),
            (
                r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null}]}"#,
                FinishReason::Abort,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"eos"}]}"#,
                FinishReason::Other,
            ),
            // Two choices: the last reason that names one.
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{},"finish_reason":null}]}"#,
                FinishReason::Stop,
            ),
        ] {
            assert_eq!(
                fast::summary(data.as_bytes()).and_then(|s| s.finish),
                Some(reason),
                "{data}"
            );
            assert_eq!(
                Summary::by_serde(data.as_bytes()).and_then(|s| s.finish),
                Some(reason),
                "{data}"
            );
            let mut acc = OpenAiAccounting::default();
            assert_eq!(classify(&mut acc, data).finish, Some(reason), "{data}");
        }
        // A reason spelled with an escape is not unescaped: both readers call it other.
        let escaped = r#"{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}"#;
        let other = Some(FinishReason::Other);
        assert_eq!(fast::summary(escaped.as_bytes()).unwrap().finish, other);
        assert_eq!(Summary::by_serde(escaped.as_bytes()).unwrap().finish, other);
    }

    #[test]
    fn reasoning_tool_arguments_and_completions_text_are_token_events() {
        let mut acc = OpenAiAccounting::default();
        for data in [
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}"#,
            r#"{"object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"x"}}]}"#,
        ] {
            assert!(classify(&mut acc, data).token_event, "{data}");
        }
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":null}}]}"#,
            r#"{"choices":null}"#,
            r#"{"object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"length"}]}"#,
        ] {
            assert!(!classify(&mut acc, data).token_event, "{data}");
        }
    }

    #[test]
    fn continuous_usage_stats_give_exact_tokens_per_event() {
        let mut acc = OpenAiAccounting::default();
        let a = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}"#,
        );
        assert_eq!(a.tokens, Some(1));
        let held = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":""}}],"usage":{"completion_tokens":2}}"#,
        );
        assert!(!held.token_event);
        let b = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":"bcd"}}],"usage":{"completion_tokens":5}}"#,
        );
        assert_eq!(b.tokens, Some(4));
    }

    #[test]
    fn errors_mid_stream_and_garbage() {
        let mut acc = OpenAiAccounting::default();
        assert!(classify(&mut acc, r#"{"error":{"message":"overloaded","code":503}}"#).error);
        assert!(classify(&mut acc, r#"{"object":"error","message":"x","code":400}"#).error);
        assert!(!classify(&mut acc, r#"{"error":null,"choices":[]}"#).error);
        assert!(classify(&mut acc, "{not json").unparsed);
        let escaped = classify(&mut acc, r#"{"model":"a\"b","choices":[]}"#);
        assert_eq!(escaped.model, None);
    }

    #[test]
    fn done_with_and_without_a_space() {
        // The scanner drops one space after `data:`; a second one, or none, reaches the accountant.
        let mut acc = OpenAiAccounting::default();
        for data in ["[DONE]", " [DONE]", "[DONE]\r", "  [DONE]  "] {
            let done = classify(&mut acc, data);
            assert!(done.end && !done.token_event && !done.unparsed, "{data:?}");
        }
    }

    #[test]
    fn token_ids_are_the_exact_count_of_their_event() {
        let mut acc = OpenAiAccounting::default();
        let two = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"Hello"},"token_ids":[9906,0]}]}"#,
        );
        assert!(two.token_event);
        assert_eq!(two.tokens, Some(2));
        let held = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":""},"token_ids":[127]}]}"#,
        );
        assert!(!held.token_event);
        assert_eq!(held.tokens, Some(1), "counted toward the total only");
        let both = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"text":"a","token_ids":[1]},{"index":1,"text":"b","token_ids":[2,3,4]}]}"#,
        );
        assert_eq!(both.tokens, Some(4), "all choices of the chunk");
        let with_usage = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5]}],"usage":{"completion_tokens":9}}"#,
        );
        assert_eq!(
            with_usage.tokens,
            Some(1),
            "the ids win over the usage growth"
        );
        assert_eq!(with_usage.usage_total, Some(9));
        let none = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":null}]}"#,
        );
        assert_eq!(none.tokens, None);
    }
    /// Where the walker answers, serde answers the same; serde is the reference.
    fn agrees(data: &str) -> Option<Summary<'_>> {
        let fast = fast::summary(data.as_bytes());
        if let Some(fast) = fast {
            assert_eq!(Some(fast), Summary::by_serde(data.as_bytes()), "{data}");
        }
        fast
    }

    #[test]
    fn the_walker_reads_every_fixture_chunk_as_serde_does() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut read = 0;
        for name in [
            "openai_chat_vllm.sse",
            "openai_chat_crlf_e2e.sse",
            "openai_completions_n2.sse",
            "openai_continuous_usage.sse",
            "openai_error_midstream.sse",
            "openai_token_ids.sse",
            "tgi_v1_chat.sse",
        ] {
            let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
            for line in text.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if !data.starts_with('{') {
                    continue;
                }
                assert!(agrees(data).is_some(), "{name}: the walker declined {data}");
                read += 1;
            }
        }
        assert!(read > 20, "{read}");
    }

    #[test]
    fn the_walker_declines_what_it_cannot_read_exactly() {
        for data in [
            r#"{"model":"a","model":"b","choices":[]}"#,
            r#"{"mod\u0065l":"a","choices":[]}"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[null]}"#,
            r#"{"choices":[{"delta":[]}]}"#,
            r#"{"choices":[{"token_ids":{}}]}"#,
            r#"{"usage":{"completion_tokens":-1}}"#,
            r#"{"usage":{"completion_tokens":1.0}}"#,
            r#"{"usage":{"completion_tokens":1e2}}"#,
            r#"{"usage":{"completion_tokens":18446744073709551616}}"#,
            r#"{"choices":[],}"#,
            r#"{"choices":[1,]}"#,
            r#"{"id":"a\x"}"#,
            "{\"id\":\"a\u{1}\"}",
            r#"{"id":01}"#,
            r#"{"id":1.}"#,
            r#"{"id":-}"#,
            r#"{"id":tru}"#,
            r#"{"choices":[]} x"#,
            r#"["m"]"#,
            r#"{"choices":[{"delta":{"content":"x"},"delta":null}]}"#,
        ] {
            assert_eq!(fast::summary(data.as_bytes()), None, "{data}");
        }
        let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(100), "]".repeat(100));
        assert_eq!(fast::summary(deep.as_bytes()), None);
        assert_eq!(fast::summary(b"{\"id\":\"\xff\",\"choices\":[]}"), None);
    }

    #[test]
    fn the_walker_agrees_on_edge_cases_it_reads() {
        for data in [
            r#" { "model" : "m" , "choices" : [ { "delta" : { "content" : "x" } } ] } "#,
            r#"{"model":"a\"b","choices":[]}"#,
            r#"{"model":null,"object":"error"}"#,
            r#"{"model":3,"error":{"message":"x"}}"#,
            r#"{"error":null,"choices":null,"usage":null}"#,
            r#"{"choices":[{"delta":null,"text":"\u00e9"}]}"#,
            r#"{"choices":[{"delta":{"content":"","tool_calls":[{"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":null},{"id":"x"}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"},"token_ids":[1,[2],{"a":3},"4",null]}]}"#,
            r#"{"choices":[{"token_ids":null}],"usage":{"completion_tokens":0,"x":[1e-3,-0.5E+7]}}"#,
            r#"{"x":{"y":[true,false,null,"\\\/\b\f\n\r\t\uABCD"]},"choices":[]}"#,
            r#"{"choices":[{"delta":{"reasoning":"r"}},{"delta":{"reasoning_content":""}}]}"#,
        ] {
            assert!(agrees(data).is_some(), "declined {data}");
        }
    }

    /// The template made from walking `base`, and whether it reads `next` (checked against serde).
    fn template_reads(base: &str, next: &str) -> bool {
        let (summary, text) = fast::summary_and_text(base.as_bytes()).expect("walked");
        let template = fast::Template::new(base.as_bytes(), text.expect("a token event"), &summary);
        match template.read(next.as_bytes()) {
            Some(read) => {
                assert_eq!(Some(read), Summary::by_serde(next.as_bytes()), "{next}");
                true
            }
            None => false,
        }
    }

    const VLLM_CHUNK: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,"finish_reason":null}]}"#;

    #[test]
    fn a_chunk_that_differs_only_in_its_text_is_read_by_the_template() {
        let long = "long ".repeat(40);
        for text in [
            " there",
            "x",
            r#"a\"b"#,
            r#"\u00e9\n"#,
            r#"a\\"#,
            "\u{e9}\u{4e16}",
            &long,
        ] {
            let next = VLLM_CHUNK.replace(" Hi", text);
            assert!(template_reads(VLLM_CHUNK, &next), "{next}");
        }
        // The model after the text: found at the same distance from the end.
        let after = r#"{"choices":[{"delta":{"content":"ab"}}],"model":"late-model","id":"x"}"#;
        let next = after.replace("ab", "a much longer text");
        assert!(template_reads(after, &next));
        let (summary, text) = fast::summary_and_text(after.as_bytes()).unwrap();
        let template = fast::Template::new(after.as_bytes(), text.unwrap(), &summary);
        assert_eq!(
            template.read(next.as_bytes()).unwrap().model,
            Some("late-model")
        );
    }

    #[test]
    fn a_chunk_the_template_cannot_vouch_for_is_walked() {
        for next in [
            VLLM_CHUNK.replace(" Hi", ""), // empty: not a token event
            VLLM_CHUNK.replace(" Hi", r#"a"},"x":{"y":"b"#), // a quote ends the text early
            VLLM_CHUNK.replace(" Hi", r#"x\"#), // escapes the closing quote
            VLLM_CHUNK.replace(" Hi", r#"x\u12"#), // a bad escape
            VLLM_CHUNK.replace(" Hi", r#"x\q"#),
            VLLM_CHUNK.replace(" Hi", "x\u{1}"), // a control character
            VLLM_CHUNK.replace(r#""created":1"#, r#""created":2"#), // another number
            VLLM_CHUNK.replace("}]}", "}]} "),
            VLLM_CHUNK.replace(" Hi", "x").replace("index", "indey"),
        ] {
            assert!(!template_reads(VLLM_CHUNK, &next), "{next}");
        }
        // Invalid UTF-8 in the new text.
        let mut bytes = VLLM_CHUNK.as_bytes().to_vec();
        bytes[VLLM_CHUNK.find(" Hi").unwrap()] = 0xff;
        let (summary, text) = fast::summary_and_text(VLLM_CHUNK.as_bytes()).unwrap();
        let template = fast::Template::new(VLLM_CHUNK.as_bytes(), text.unwrap(), &summary);
        assert_eq!(template.read(&bytes), None);
    }

    #[test]
    fn a_stream_reads_the_same_with_its_template() {
        // One accountant over the stream (its template in use) against a fresh accountant per
        // chunk (never a template).
        let chunks: Vec<String> = [" a", " b", "", r#"\""#, " c", "d", r#"x\"#]
            .iter()
            .map(|t| VLLM_CHUNK.replace(" Hi", t))
            .chain([VLLM_CHUNK.replace(r#""model":"m""#, r#""model":"other""#)])
            .collect();
        let mut streamed = OpenAiAccounting::default();
        for chunk in &chunks {
            let with = classify(&mut streamed, chunk);
            let alone = classify(&mut OpenAiAccounting::default(), chunk);
            assert_eq!(with, alone, "{chunk}");
        }
        assert!(streamed.template.is_some());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Random edits of real chunks: wherever the walker answers, serde answers the same.
        #[test]
        fn the_walker_never_disagrees_with_serde(
            base in 0usize..4,
            edits in proptest::collection::vec((0usize..400, 0usize..3, 0usize..24), 0..4),
        ) {
            const BASES: [&str; 4] = [
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,"finish_reason":null}]}"#,
                r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a"}}]},"token_ids":[1,2]}]}"#,
                r#"{"object":"text_completion","choices":[{"index":0,"text":"a\nb","finish_reason":null},{"index":1,"text":""}],"error":null}"#,
            ];
            const PIECES: [&str; 24] = [
                "{", "}", "[", "]", ",", ":", "\"", "\\", " ", "null", "1", "-", ".", "e", "0",
                "\"model\"", "\"choices\"", "\"delta\"", "\"content\"", "\"usage\"",
                "\"token_ids\"", "\"error\"", "\u{e9}", "\"\"",
            ];
            let mut data = BASES[base].to_string();
            for (at, op, piece) in edits {
                let mut at = at % (data.len() + 1);
                while !data.is_char_boundary(at) {
                    at -= 1;
                }
                match op {
                    0 => data.insert_str(at, PIECES[piece]),
                    1 => {
                        let mut end = (at + 1 + piece % 8).min(data.len());
                        while !data.is_char_boundary(end) {
                            end += 1;
                        }
                        data.replace_range(at..end, "");
                    }
                    _ => {
                        let mut end = (at + 1).min(data.len());
                        while !data.is_char_boundary(end) {
                            end += 1;
                        }
                        data.replace_range(at..end, PIECES[piece]);
                    }
                }
            }
            if let Some(fast) = fast::summary(data.as_bytes()) {
                proptest::prop_assert_eq!(Some(fast), Summary::by_serde(data.as_bytes()), "{}", data);
            }
        }

        /// A template reads a chunk only as serde does, whatever replaces its text and whatever
        /// else is edited; and a chunk that differs in its text alone (text of safe pieces) is
        /// always read by it.
        #[test]
        fn the_template_never_disagrees_with_serde(
            base in 0usize..3,
            pieces in proptest::collection::vec(0usize..16, 0..12),
            edit in proptest::option::of((0usize..400, 0usize..16)),
        ) {
            const BASES: [&str; 3] = [
                VLLM_CHUNK,
                r#"{"object":"text_completion","choices":[{"index":0,"text":"a\nb","finish_reason":null},{"index":1,"text":"c"}],"model":"m2","usage":{"completion_tokens":3}}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"r"},"token_ids":[1,2]}],"model":"m3"}"#,
            ];
            const PIECES: [&str; 16] = [
                "a", " ", "\u{e9}", r#"\n"#, r#"\u00e9"#, r#"\\"#, r#"\""#, "\u{4e16}",
                "\"", "\\", "\u{1}", r#"\u12"#, r#"\x"#, "}", "]", "\u{7f}",
            ];
            let base = BASES[base];
            let (summary, text) = fast::summary_and_text(base.as_bytes()).unwrap();
            let (open, end) = text.unwrap();
            let template = fast::Template::new(base.as_bytes(), (open, end), &summary);
            let new_text: String = pieces.iter().map(|p| PIECES[*p]).collect();
            let mut next = format!("{}{}{}", &base[..=open], new_text, &base[end - 1..]);
            let safe = !new_text.is_empty() && pieces.iter().all(|p| *p < 8);
            if let Some((at, piece)) = edit {
                let mut at = at % (next.len() + 1);
                while !next.is_char_boundary(at) {
                    at -= 1;
                }
                next.insert_str(at, PIECES[piece]);
            }
            match template.read(next.as_bytes()) {
                Some(read) => proptest::prop_assert_eq!(
                    Some(read),
                    Summary::by_serde(next.as_bytes()),
                    "{}",
                    next
                ),
                None => proptest::prop_assert!(!safe || edit.is_some(), "not read: {}", next),
            }
        }
    }
}
