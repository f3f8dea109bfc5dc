//! A one-pass reader of OpenAI chunks, for the hot path.
//!
//! serde's derived readers are exact but cost about 5,000 instructions on a typical 230-byte chunk
//! (a visitor per field, UTF-8 checks per borrowed value); this walker reads the same fields in
//! one pass over the bytes. It accepts exactly the JSON grammar serde_json accepts (strings with
//! their escapes, numbers, literals, whitespace, no trailing commas) and returns `None` for
//! anything it is not sure to read as serde would: escaped or repeated field names, a field of an
//! unexpected type, a number that is not a plain unsigned integer where one is read, deep nesting,
//! invalid UTF-8 anywhere, a non-object. `None` sends the chunk to serde, so the result is always
//! serde's; the property test below checks that where the walker answers, serde agrees.

use std::mem::replace;

use super::grammar::{non_empty_string, plain_string, Span};
use super::{FinishReason, Phase, Summary};

/// The chunk's summary, or `None` to leave it to serde.
#[cfg(test)]
pub(super) fn summary(data: &[u8]) -> Option<Summary<'_>> {
    walk(data).map(|walked| walked.summary)
}

/// `usage.prompt_tokens` and `usage.completion_tokens_details.reasoning_tokens`, as
/// `usage_details_by_serde` reads them.
pub(super) type UsageDetails = (Option<u64>, Option<u64>);

/// What one pass of the walker read of a chunk.
pub(super) struct Walked<'a> {
    /// The chunk's summary, as serde's `Summary::by_serde` reads it.
    pub(super) summary: Summary<'a>,
    /// When the chunk is a token event, the raw span of a non-empty text value that makes it one
    /// (the last such).
    pub(super) text: Option<Span>,
    /// The usage details, when the walker is sure `usage_details_by_serde` reads them so;
    /// `None` leaves them to serde (a type it does not take, a repeated field).
    pub(super) usage_details: Option<UsageDetails>,
}

/// The walker's reading of `data`; `None` to leave the chunk to serde.
pub(super) fn walk(data: &[u8]) -> Option<Walked<'_>> {
    let mut walker = Walker::new(data)?;
    let mut summary = walker.chunk()?;
    if !walker.at_end() {
        return None;
    }
    summary.token_event = walker.phase.is_some();
    summary.phase = walker.phase.unwrap_or_default();
    summary.text = walker.content.map(|(start, end)| &data[start + 1..end - 1]);
    Some(Walked {
        summary,
        text: walker.content.or(walker.other),
        usage_details: walker.usage_details,
    })
}

pub(super) struct Walker<'a> {
    pub(super) text: &'a str,
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
    pub(super) depth: u32,
    /// The raw span of the last non-empty `content` or `text` string read.
    content: Option<Span>,
    /// The raw span of the last non-empty `reasoning_content` or `reasoning` string read.
    other: Option<Span>,
    /// The phase of the output read so far (content before tool_call before reasoning).
    phase: Option<Phase>,
    /// The usage details read so far; `None` once a field is one serde must read.
    usage_details: Option<UsageDetails>,
}

/// The raw text of each top-level field of the object `data` that `field` numbers below `N`
/// (`None` where it is absent or `null`), as serde reads a struct of `Option<&RawValue>` fields
/// with those names; `None` to leave `data` to serde (not an object, a repeated or escaped field
/// name, invalid JSON or UTF-8, deep nesting). For format detection, which reads any API's first
/// event this way; `field` is a `match` on the name, which compiles to a few comparisons.
pub(in crate::format) fn top_level_fields<const N: usize>(
    data: &[u8],
    field: impl Fn(&[u8]) -> Option<usize>,
) -> Option<[Option<&str>; N]> {
    let mut walker = Walker::new(data)?;
    if walker.peek()? != b'{' {
        return None; // serde also reads a struct from an array
    }
    let (text, mut found, mut seen) = (walker.text, [None; N], [false; N]);
    walker.object(|w, name| {
        let Some(field) = field(name).filter(|&i| i < N) else {
            return w.value().map(drop);
        };
        if replace(&mut seen[field], true) {
            return None; // serde refuses a repeated field
        }
        found[field] = w.optional()?.map(|(start, end)| &text[start..end]);
        Some(())
    })?;
    walker.at_end().then_some(found)
}

// === impl Walker ===

impl<'a> Walker<'a> {
    /// A walker at the start of `data`; `None` when `data` is not UTF-8.
    fn new(data: &'a [u8]) -> Option<Self> {
        // serde checks the UTF-8 of the values it borrows; checking all of it is a superset, and
        // a chunk that fails goes to serde.
        let text = std::str::from_utf8(data).ok()?;
        Some(Walker {
            text,
            bytes: data,
            at: 0,
            depth: 0,
            content: None,
            other: None,
            phase: None,
            usage_details: Some((None, None)),
        })
    }

    /// Whether only whitespace is left, as serde requires after the value.
    fn at_end(&mut self) -> bool {
        self.whitespace();
        self.at == self.bytes.len()
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

    /// `usage`: its `completion_tokens`, when a plain unsigned integer (or null / absent); its
    /// details go to `usage_details`.
    fn usage(&mut self) -> Option<Option<u64>> {
        let (mut seen, mut total) = ([false; 3], None);
        self.object(|w, name| {
            let field = match name {
                b"completion_tokens" => 0,
                b"prompt_tokens" => 1,
                b"completion_tokens_details" => 2,
                _ => return w.value().map(drop),
            };
            if replace(&mut seen[field], true) {
                if field == 0 {
                    return None; // serde refuses a repeated field
                }
                // Only the details reader refuses this one: the summary stands.
                w.usage_details = None;
                return w.value().map(drop);
            }
            match field {
                0 => {
                    if let Some(span) = w.optional()? {
                        // A sign, fraction or exponent: serde decides.
                        total = Some(plain_u64(w.raw(span))?);
                    }
                }
                1 => {
                    let prompt = w.detail()?;
                    if let Some(details) = &mut w.usage_details {
                        details.0 = prompt;
                    }
                }
                _ => w.completion_details()?,
            }
            Some(())
        })?;
        Some(total)
    }

    /// A usage detail, an `Option<u64>` to serde: a plain unsigned integer, or `None` for
    /// `null` (and for anything else, which also leaves the details to serde).
    fn detail(&mut self) -> Option<Option<u64>> {
        let Some(span) = self.optional()? else {
            return Some(None);
        };
        let value = plain_u64(self.raw(span));
        if value.is_none() {
            self.usage_details = None;
        }
        Some(value)
    }

    /// `usage.completion_tokens_details`: its `reasoning_tokens`, to `usage_details`.
    fn completion_details(&mut self) -> Option<()> {
        if !matches!(self.peek()?, b'n' | b'{') {
            // Not a struct to serde's details reader: skipped here, serde decides.
            self.usage_details = None;
            return self.value().map(drop);
        }
        let mut seen = false;
        self.null_or_object(|w| {
            w.object(|w, name| {
                if name != b"reasoning_tokens" {
                    return w.value().map(drop);
                }
                if replace(&mut seen, true) {
                    w.usage_details = None;
                    return w.value().map(drop);
                }
                let reasoning = w.detail()?;
                if let Some(details) = &mut w.usage_details {
                    details.1 = reasoning;
                }
                Some(())
            })
        })
    }
}

/// A JSON number's raw text as a `u64`, when it is plain digits that fit; `None` for a sign,
/// fraction or exponent, or for anything that is not a number.
fn plain_u64(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(raw).ok()?.parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::super::usage_details_by_serde;
    use super::*;

    /// Where the walker answers, serde answers the same; serde is the reference.
    fn agrees(data: &str) -> Option<Summary<'_>> {
        let walked = walk(data.as_bytes())?;
        assert_eq!(
            Some(walked.summary),
            Summary::by_serde(data.as_bytes()),
            "{data}"
        );
        if let Some(details) = walked.usage_details {
            assert_eq!(details, usage_details_by_serde(data.as_bytes()), "{data}");
        }
        Some(walked.summary)
    }

    /// The walker's usage details of `data`, checked against serde's where it has them.
    fn details(data: &str) -> Option<UsageDetails> {
        agrees(data).expect("the walker reads the chunk");
        walk(data.as_bytes()).unwrap().usage_details
    }

    #[test]
    fn the_walker_reads_usage_details_as_serde_does() {
        for (data, expected) in [
            (
                r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}"#,
                (Some(5), None),
            ),
            (
                r#"{"usage":{"prompt_tokens":7,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":4,"x":[1]}}}"#,
                (Some(7), Some(4)),
            ),
            (
                r#"{"usage":{"completion_tokens":9,"completion_tokens_details":null,"prompt_tokens":null}}"#,
                (None, None),
            ),
            (
                r#"{"usage":{"completion_tokens_details":{"reasoning_tokens":null},"completion_tokens":1}}"#,
                (None, None),
            ),
            (r#"{"usage":null}"#, (None, None)),
            (r#"{"choices":[]}"#, (None, None)),
        ] {
            assert_eq!(details(data), Some(expected), "{data}");
        }
    }

    #[test]
    fn the_walker_leaves_usage_details_it_cannot_read_exactly_to_serde() {
        for data in [
            r#"{"usage":{"prompt_tokens":-1,"completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":1.0,"completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":"5","completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":18446744073709551616,"completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":1}}"#,
            r#"{"usage":{"completion_tokens_details":[3],"completion_tokens":1}}"#,
            r#"{"usage":{"completion_tokens_details":7,"completion_tokens":1}}"#,
            r#"{"usage":{"completion_tokens_details":{"reasoning_tokens":1e1}}}"#,
            r#"{"usage":{"completion_tokens_details":{"reasoning_tokens":1,"reasoning_tokens":1}}}"#,
            r#"{"usage":{"completion_tokens_details":{},"completion_tokens_details":{}}}"#,
        ] {
            assert_eq!(details(data), None, "{data}");
        }
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
            assert_eq!(summary(data.as_bytes()), None, "{data}");
        }
        let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(100), "]".repeat(100));
        assert_eq!(summary(deep.as_bytes()), None);
        assert_eq!(summary(b"{\"id\":\"\xff\",\"choices\":[]}"), None);
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Random edits of real chunks: wherever the walker answers, serde answers the same.
        #[test]
        fn the_walker_never_disagrees_with_serde(
            base in 0usize..7,
            edits in proptest::collection::vec((0usize..400, 0usize..3, 0usize..30), 0..4),
        ) {
            const BASES: [&str; 7] = [
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,"finish_reason":null}]}"#,
                r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a"}}]},"token_ids":[1,2]}]}"#,
                r#"{"object":"text_completion","choices":[{"index":0,"text":"a\nb","finish_reason":null},{"index":1,"text":""}],"error":null}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":40,"completion_tokens_details":{"reasoning_tokens":30}}}"#,
                r#"{"usage":{"prompt_tokens":-1,"completion_tokens":4,"completion_tokens_details":{"reasoning_tokens":3}}}"#,
                r#"{"usage":{"prompt_tokens":2,"completion_tokens":4,"completion_tokens_details":[3]}}"#,
            ];
            const PIECES: [&str; 30] = [
                "{", "}", "[", "]", ",", ":", "\"", "\\", " ", "null", "1", "-", ".", "e", "0",
                "\"model\"", "\"choices\"", "\"delta\"", "\"content\"", "\"usage\"",
                "\"token_ids\"", "\"error\"", "\u{e9}", "\"\"", "\"prompt_tokens\"",
                "\"completion_tokens_details\"", "\"reasoning_tokens\"", "\"prompt_tokens\":-1,",
                "\"reasoning_tokens\":\"7\",", ",\"prompt_tokens\":3",
            ];
            let data = crate::format::json::edited(BASES[base], &edits, &PIECES);
            if let Some(walked) = walk(data.as_bytes()) {
                proptest::prop_assert_eq!(
                    Some(walked.summary),
                    Summary::by_serde(data.as_bytes()),
                    "{}",
                    data
                );
                if let Some(details) = walked.usage_details {
                    proptest::prop_assert_eq!(details, usage_details_by_serde(data.as_bytes()), "{}", data);
                }
            }
        }
    }
}
