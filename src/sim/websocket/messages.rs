//! A generated stream's frames as WebSocket messages.
//!
//! Every shape writes its events as SSE, so one stream machinery (cadence, coalescing, the
//! buffering edge, `--engine batch`, the timeline, the counters) drives the HTTP streams and the
//! WebSocket responses alike. Over a WebSocket each event is one text message: its `data`, the
//! very JSON the SSE shape sends. The sim's own frames hold whole events, so a message is a slice
//! of its frame, not a copy.

use bytes::Bytes;

use crate::scan::{Event, EventSink, Framing, Scanner};

/// Longest event read back from a frame: far beyond the largest the sim writes (a
/// `response.done` repeating a long output), so no event is ever cut.
const MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// Splits one stream's frames into messages.
#[derive(Debug)]
pub(super) struct Framer {
    scanner: Scanner,
}

/// The scanner's sink: each event's data, a slice of `frame` where it lies inside it.
struct Collect<'a> {
    frame: &'a Bytes,
    out: &'a mut Vec<Bytes>,
}

impl EventSink for Collect<'_> {
    fn on_event(&mut self, event: Event<'_>) {
        let message = if self.frame.as_ptr_range().contains(&event.data.as_ptr())
            && event.data.len() <= self.frame.len()
        {
            self.frame.slice_ref(event.data)
        } else {
            Bytes::copy_from_slice(event.data)
        };
        self.out.push(message);
    }
}

// === impl Framer ===

impl Framer {
    /// A framer for a new stream.
    pub(super) fn new() -> Self {
        Framer {
            scanner: Scanner::new(Framing::Sse, MAX_EVENT_BYTES),
        }
    }

    /// Appends the messages of `frame` to `out`, in order.
    pub(super) fn messages(&mut self, frame: &Bytes, out: &mut Vec<Bytes>) {
        let mut sink = Collect { frame, out };
        self.scanner.feed(frame, &mut sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_a_message_sliced_from_its_frame() {
        let frame = Bytes::from_static(
            b"event: a\ndata: {\"type\":\"a\"}\n\ndata: {\"type\":\"b\"}\n\ndata: {\"ty",
        );
        let mut framer = Framer::new();
        let mut out = Vec::new();
        framer.messages(&frame, &mut out);
        assert_eq!(out, [&b"{\"type\":\"a\"}"[..], &b"{\"type\":\"b\"}"[..]]);
        assert!(
            frame.as_ptr_range().contains(&out[0].as_ptr()),
            "not copied"
        );
        // An event cut across frames (never written by the sim) is gathered, not lost.
        framer.messages(&Bytes::from_static(b"pe\":\"c\"}\n\n"), &mut out);
        assert_eq!(out[2], &b"{\"type\":\"c\"}"[..]);
    }
}
