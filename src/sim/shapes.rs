//! The wire formats the sim speaks: OpenAI chat and completions chunks as vLLM sends them, TGI's
//! native `/generate_stream` events and Anthropic's Messages events.
//!
//! A stream is a preamble (events before the first token), one token event per decode step and a
//! trailer (finish, usage, end marker). Each piece is written straight into the frame's buffer:
//! no intermediate values, so the only allocation per frame is the frame itself. The text is
//! pseudo-words (` tok17`) that are a pure function of the seed, the stream and the token index,
//! so any part of the output can be rewritten later (TGI's `generated_text`) without keeping it.

use std::fmt::Write as _;

use bytes::BytesMut;

/// Which API a request came in on, and so which shape its response has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// TGI's `POST /generate_stream`.
    Tgi,
    /// Anthropic's `POST /v1/messages`.
    Anthropic,
}

/// Why the output ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The model chose to stop (the sim's default length was used).
    Stop,
    /// The request's token limit (or the sim's cap) was reached.
    Length,
}

/// One stream's fixed facts, enough to write any of its events.
#[derive(Debug, Clone)]
pub(crate) struct Wire {
    /// The API whose shape is written.
    pub api: Api,
    /// The stream's sequence number, part of every ID.
    pub seq: u64,
    /// Unix seconds at the request's arrival (`created`).
    pub created: u64,
    /// The model name as a JSON string literal, quotes included (escaped once at start-up).
    pub model_json: std::sync::Arc<str>,
    /// Seed of the stream's words.
    pub word_seed: u64,
    /// Prompt tokens reported in usage.
    pub prompt_tokens: u64,
    /// Output tokens of the whole stream.
    pub completion_tokens: u64,
    /// Why the output ends.
    pub finish: Finish,
    /// Whether the OpenAI shapes end with a usage chunk.
    pub usage: bool,
    /// Whether every OpenAI token chunk carries the running usage (vLLM's
    /// `stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
}

/// The token ID TGI reports for the EOS token.
const EOS_ID: u64 = 2;

// === impl Wire ===

impl Wire {
    /// Events sent before the first token event, each in its own frame.
    pub(crate) fn preamble_len(&self) -> usize {
        match self.api {
            Api::Chat => 1,
            Api::Completions | Api::Tgi => 0,
            Api::Anthropic => 3,
        }
    }

    /// Writes preamble event `i` (`i < preamble_len()`).
    pub(crate) fn write_preamble(&self, i: usize, buf: &mut BytesMut) {
        match (self.api, i) {
            (Api::Chat, _) => {
                self.openai_head(buf);
                buf.extend_from_slice(
                    br#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                );
                end(buf);
            }
            (Api::Anthropic, 0) => {
                begin(buf, Some("message_start"));
                let _ = write!(
                    buf,
                    r#"{{"type":"message_start","message":{{"id":"msg_sim_{}","type":"message","role":"assistant","model":{},"content":[],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":{},"output_tokens":1}}}}}}"#,
                    self.seq, self.model_json, self.prompt_tokens
                );
                end(buf);
            }
            (Api::Anthropic, 1) => {
                begin(buf, Some("content_block_start"));
                buf.extend_from_slice(
                    br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                );
                end(buf);
            }
            (Api::Anthropic, _) => {
                begin(buf, Some("ping"));
                buf.extend_from_slice(br#"{"type":"ping"}"#);
                end(buf);
            }
            (Api::Completions | Api::Tgi, _) => {}
        }
    }

    /// SSE events one decode step of `tokens` tokens takes: TGI sends one event per token, the
    /// others put all of a step's text in one event.
    pub(crate) fn events_per_step(&self, tokens: u32) -> u32 {
        match self.api {
            Api::Tgi => tokens,
            _ => 1,
        }
    }

    /// Writes the token event(s) of a decode step: tokens `first..first + tokens`.
    pub(crate) fn write_step(&self, first: u64, tokens: u32, buf: &mut BytesMut) {
        let last = first + u64::from(tokens);
        match self.api {
            Api::Chat => {
                self.openai_head(buf);
                buf.extend_from_slice(br#""choices":[{"index":0,"delta":{"content":""#);
                self.write_text(first..last, buf);
                buf.extend_from_slice(br#""},"logprobs":null,"finish_reason":null}]"#);
                self.continuous_usage(last, buf);
                buf.extend_from_slice(b"}");
                end(buf);
            }
            Api::Completions => {
                self.openai_head(buf);
                buf.extend_from_slice(br#""choices":[{"index":0,"text":""#);
                self.write_text(first..last, buf);
                buf.extend_from_slice(
                    br#"","logprobs":null,"finish_reason":null,"stop_reason":null}]"#,
                );
                self.continuous_usage(last, buf);
                buf.extend_from_slice(b"}");
                end(buf);
            }
            Api::Tgi => {
                for index in first..last {
                    begin(buf, None);
                    let _ = write!(
                        buf,
                        r#"{{"index":{},"token":{{"id":{},"text":""#,
                        index + 1,
                        self.word(index) + 100
                    );
                    self.write_text(index..index + 1, buf);
                    buf.extend_from_slice(
                        br#"","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#,
                    );
                    end(buf);
                }
            }
            Api::Anthropic => {
                begin(buf, Some("content_block_delta"));
                buf.extend_from_slice(
                    br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""#,
                );
                self.write_text(first..last, buf);
                buf.extend_from_slice(br#""}}"#);
                end(buf);
            }
        }
    }

    /// Events sent after the last token event, each in its own frame.
    pub(crate) fn trailer_len(&self) -> usize {
        match self.api {
            Api::Chat | Api::Completions => 2 + usize::from(self.usage),
            Api::Tgi => 1,
            Api::Anthropic => 3,
        }
    }

    /// Writes trailer event `i` (`i < trailer_len()`).
    pub(crate) fn write_trailer(&self, i: usize, buf: &mut BytesMut) {
        match self.api {
            Api::Chat | Api::Completions => match (i, self.usage) {
                (0, _) => {
                    self.openai_head(buf);
                    let choice = if self.api == Api::Chat {
                        r#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"#
                    } else {
                        r#""choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"#
                    };
                    buf.extend_from_slice(choice.as_bytes());
                    let reason = match self.finish {
                        Finish::Stop => "stop",
                        Finish::Length => "length",
                    };
                    let _ = write!(buf, r#""{reason}","stop_reason":null}}]}}"#);
                    end(buf);
                }
                (1, true) => {
                    self.openai_head(buf);
                    buf.extend_from_slice(br#""choices":[],"#);
                    self.usage_object(self.completion_tokens, buf);
                    buf.extend_from_slice(b"}");
                    end(buf);
                }
                _ => buf.extend_from_slice(b"data: [DONE]\n\n"),
            },
            Api::Tgi => {
                begin(buf, None);
                let _ = write!(
                    buf,
                    r#"{{"index":{},"token":{{"id":{EOS_ID},"text":"</s>","logprob":-0.01,"special":true}},"generated_text":""#,
                    self.completion_tokens + 1
                );
                self.write_text(0..self.completion_tokens, buf);
                buf.extend_from_slice(br#"","details":null}"#);
                end(buf);
            }
            Api::Anthropic => match i {
                0 => {
                    begin(buf, Some("content_block_stop"));
                    buf.extend_from_slice(br#"{"type":"content_block_stop","index":0}"#);
                    end(buf);
                }
                1 => {
                    begin(buf, Some("message_delta"));
                    let reason = match self.finish {
                        Finish::Stop => "end_turn",
                        Finish::Length => "max_tokens",
                    };
                    let _ = write!(
                        buf,
                        r#"{{"type":"message_delta","delta":{{"stop_reason":"{reason}","stop_sequence":null}},"usage":{{"output_tokens":{}}}}}"#,
                        self.completion_tokens
                    );
                    end(buf);
                }
                _ => {
                    begin(buf, Some("message_stop"));
                    buf.extend_from_slice(br#"{"type":"message_stop"}"#);
                    end(buf);
                }
            },
        }
    }

    /// The whole output as one string: for non-streaming responses.
    pub(crate) fn text(&self) -> String {
        let mut buf = BytesMut::new();
        self.write_text(0..self.completion_tokens, &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The stream's ID as its API spells it.
    pub(crate) fn id(&self) -> String {
        match self.api {
            Api::Chat => format!("chatcmpl-sim-{}", self.seq),
            Api::Completions => format!("cmpl-sim-{}", self.seq),
            Api::Tgi => format!("tgi-sim-{}", self.seq),
            Api::Anthropic => format!("msg_sim_{}", self.seq),
        }
    }

    /// The text of tokens `range`: JSON-safe as written (no quotes, backslashes or controls).
    fn write_text(&self, range: std::ops::Range<u64>, buf: &mut BytesMut) {
        for index in range {
            let _ = write!(buf, " tok{}", self.word(index));
        }
    }

    /// The word number of token `index`: splitmix64 of the stream's word seed and the index.
    fn word(&self, index: u64) -> u64 {
        let mut z = self
            .word_seed
            .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 1000
    }

    /// `data: {"id":…,"object":…,"created":…,"model":…,` of an OpenAI chunk.
    fn openai_head(&self, buf: &mut BytesMut) {
        begin(buf, None);
        let (prefix, object) = match self.api {
            Api::Completions => ("cmpl", "text_completion"),
            _ => ("chatcmpl", "chat.completion.chunk"),
        };
        let _ = write!(
            buf,
            r#"{{"id":"{prefix}-sim-{}","object":"{object}","created":{},"model":{},"#,
            self.seq, self.created, self.model_json
        );
    }

    /// `,"usage":{…}` after a token chunk's choices when continuous usage is on.
    fn continuous_usage(&self, completion_tokens: u64, buf: &mut BytesMut) {
        if self.continuous_usage {
            buf.extend_from_slice(b",");
            self.usage_object(completion_tokens, buf);
        }
    }

    /// `"usage":{…}` with `completion_tokens` output tokens.
    fn usage_object(&self, completion_tokens: u64, buf: &mut BytesMut) {
        let _ = write!(
            buf,
            r#""usage":{{"prompt_tokens":{},"total_tokens":{},"completion_tokens":{}}}"#,
            self.prompt_tokens,
            self.prompt_tokens + completion_tokens,
            completion_tokens
        );
    }
}

/// Starts an SSE event: its `event:` line if named, then `data: `.
fn begin(buf: &mut BytesMut, name: Option<&str>) {
    if let Some(name) = name {
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b"\n");
    }
    buf.extend_from_slice(b"data: ");
}

/// Ends an SSE event.
fn end(buf: &mut BytesMut) {
    buf.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{scan_all, Framing};

    fn wire(api: Api) -> Wire {
        Wire {
            api,
            seq: 3,
            created: 1_700_000_000,
            model_json: "\"sim-model\"".into(),
            word_seed: 42,
            prompt_tokens: 5,
            completion_tokens: 4,
            finish: Finish::Length,
            usage: true,
            continuous_usage: false,
        }
    }

    /// Every event of a whole stream with steps of 1 and 3 tokens.
    fn whole(w: &Wire) -> Vec<(String, serde_json::Value)> {
        let mut buf = BytesMut::new();
        for i in 0..w.preamble_len() {
            w.write_preamble(i, &mut buf);
        }
        w.write_step(0, 1, &mut buf);
        w.write_step(1, 3, &mut buf);
        for i in 0..w.trailer_len() {
            w.write_trailer(i, &mut buf);
        }
        scan_all(Framing::Sse, &buf, 1 << 20)
            .events
            .into_iter()
            .map(|(kind, data, _)| {
                let kind = String::from_utf8(kind).unwrap();
                let value = if data == b"[DONE]" {
                    serde_json::Value::Null
                } else {
                    serde_json::from_slice(&data).unwrap()
                };
                (kind, value)
            })
            .collect()
    }

    #[test]
    fn chat_stream_is_vllm_shaped() {
        let events = whole(&wire(Api::Chat));
        assert_eq!(events.len(), 6);
        assert_eq!(events[0].1["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[0].1["object"], "chat.completion.chunk");
        assert_eq!(
            events[2].1["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count(),
            3
        );
        assert_eq!(events[3].1["choices"][0]["finish_reason"], "length");
        assert_eq!(events[4].1["usage"]["completion_tokens"], 4);
        assert_eq!(events[4].1["usage"]["total_tokens"], 9);
        assert_eq!(events[5].1, serde_json::Value::Null);
    }

    #[test]
    fn words_repeat_for_the_same_seed() {
        let text = wire(Api::Chat).text();
        assert_eq!(text, wire(Api::Chat).text());
        assert!(text.starts_with(" tok"));
        let other = Wire {
            word_seed: 43,
            ..wire(Api::Chat)
        };
        assert_ne!(text, other.text());
    }

    #[test]
    fn tgi_sends_one_event_per_token_and_an_eos() {
        let w = wire(Api::Tgi);
        let events = whole(&w);
        assert_eq!(events.len(), 5);
        assert_eq!(events[2].1["index"], 3);
        let last = &events[4].1;
        assert_eq!(last["token"]["special"], true);
        assert_eq!(last["token"]["text"], "</s>");
        assert_eq!(last["generated_text"], w.text());
    }

    #[test]
    fn anthropic_events_are_named() {
        let events = whole(&wire(Api::Anthropic));
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (kind, value) in &events {
            assert_eq!(value["type"], kind.as_str());
        }
        assert_eq!(events[6].1["usage"]["output_tokens"], 4);
        assert_eq!(events[6].1["delta"]["stop_reason"], "max_tokens");
    }

    #[test]
    fn completions_use_text() {
        let w = Wire {
            continuous_usage: true,
            usage: false,
            ..wire(Api::Completions)
        };
        let events = whole(&w);
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].1["object"], "text_completion");
        assert!(events[0].1["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" tok"));
        assert_eq!(events[1].1["usage"]["completion_tokens"], 4);
    }
}
