//! A non-streaming answer read whole (`format::whole::read`), as the proxy reads one at the end
//! of its body: any bytes, under any configured format and any format the path names, never
//! panic; an unreadable body reports no usage figure and no model; a model name is borrowed from
//! the body; the Gemini path rule never panics on any path.
//! Input: 1 byte picks the configured format (or none), 1 byte the path's (or none), then the
//! body; the body also serves as a path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::format::{whole, Format};

/// `Format::ALL` entry `byte`, or none for the values past it.
fn pick(byte: u8) -> Option<Format> {
    Format::ALL.get(usize::from(byte) % (Format::ALL.len() + 1)).copied()
}

fuzz_target!(|data: &[u8]| {
    let [configured, path, body @ ..] = data else {
        return;
    };
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = whole::path_format(text);
    }
    let Some(read) = whole::read(body, pick(*configured), pick(*path)) else {
        return;
    };
    if read.unparsed {
        assert!(
            read.usage_total.is_none() && read.usage_prompt.is_none() && read.model.is_none(),
            "an unreadable body reported figures"
        );
    }
    if let Some(model) = read.model {
        let all = body.as_ptr_range();
        let m = model.as_bytes().as_ptr_range();
        assert!(
            all.start <= m.start && m.end <= all.end,
            "the model name is not borrowed from the body"
        );
    }
});
