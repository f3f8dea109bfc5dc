//! TGI's native `/generate_stream` (`router/src/server.rs`, `StreamResponse`): one event per
//! token, then the special end-of-sequence token with `generated_text`. It has no reasoning field
//! and no tool calls, so a reasoning model's thinking is ordinary tokens between think tags.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;
use serde_json::json;

use super::{begin, end, Tags, Wire};

/// The token ID TGI reports for the EOS token.
const EOS_ID: u64 = 2;

/// One event per token of the step.
pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    let events = range.end - range.start;
    for index in range {
        begin(buf, None);
        let _ = write!(
            buf,
            r#"{{"index":{},"token":{{"id":{},"text":""#,
            index + 1,
            w.word(index) + 100
        );
        w.write_text(index..index + 1, Tags::Plain, buf);
        buf.extend_from_slice(
            br#"","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#,
        );
        end(buf);
    }
    u32::try_from(events).unwrap_or(u32::MAX)
}

/// The end-of-sequence event with the whole text.
pub(super) fn write_trailer(w: &mut Wire, buf: &mut BytesMut) {
    begin(buf, None);
    let _ = write!(
        buf,
        r#"{{"index":{},"token":{{"id":{EOS_ID},"text":"</s>","logprob":-0.01,"special":true}},"generated_text":""#,
        w.output.total() + 1
    );
    w.write_text(0..w.output.total(), Tags::Plain, buf);
    buf.extend_from_slice(br#"","details":null}"#);
    end(buf);
}

/// The non-streamed answer of `/generate`.
pub(super) fn whole(w: &Wire) -> serde_json::Value {
    json!({ "generated_text": w.text_of(0..w.output.total()) })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Api;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::Output;

    #[test]
    fn tgi_sends_one_event_per_token_and_an_eos() {
        let mut w = wire(Api::Tgi, Output::answer(4));
        let written = write_all(&mut w);
        let events = written.events;
        assert_eq!(events.len(), 5);
        assert_eq!(written.step_events, [1, 3]);
        assert_eq!(events[2].1["index"], 3);
        let last = &events[4].1;
        assert_eq!(last["token"]["special"], true);
        assert_eq!(last["token"]["text"], "</s>");
        assert_eq!(last["generated_text"], w.answer_text());
    }

    #[test]
    fn thinking_is_tokens_between_think_tags() {
        let mut w = wire(Api::Tgi, agent(3, 2, 0, 1, ThinkTags::Parser));
        let events = write_all(&mut w).events;
        let texts: Vec<&str> = events
            .iter()
            .filter(|(_, v)| v["token"]["special"] == false)
            .map(|(_, v)| v["token"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 5);
        assert_eq!((texts[0], texts[2]), ("<think>", "</think>"));
        assert!(texts[1].starts_with(" idea") && texts[3].starts_with(" tok"));
        let generated = events[5].1["generated_text"].as_str().unwrap();
        assert!(generated.starts_with("<think> idea"), "{generated}");
    }
}
