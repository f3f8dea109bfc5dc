//! The WHATWG event-stream parser, made incremental.
//!
//! Line ends are LF, CR or CRLF (a CR that ends one frame and an LF that starts the next are one
//! line end); a leading BOM is skipped; `:` lines are comments; the field name runs to the first
//! colon and exactly one space after it is dropped; `data` lines join with `\n`; a blank line
//! dispatches; an event whose data buffer is empty is not dispatched.
//!
//! The common case, an event whose data is one line inside one frame, is reported as a slice of
//! that frame: no copy at all. Only an event that spans frames, or has several data lines, is
//! gathered into a buffer, and that buffer is bounded.

use super::{release_if_large, Event, EventSink};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
/// The longest `event:` type that is kept; longer ones are cut (no real API comes close).
const MAX_KIND_BYTES: usize = 256;

/// Incremental server-sent-events scanner. Memory: at most about twice `max_event_bytes`.
#[derive(Debug)]
pub struct SseScanner {
    /// The bound on a carried partial line and on gathered data.
    max_event_bytes: usize,
    /// How many bytes of a leading BOM have matched so far; `None` once the start is decided.
    bom_matched: Option<usize>,
    /// The previous frame ended in CR: an LF at the start of the next one belongs to it.
    pending_cr: bool,
    /// A line that a frame ended in the middle of.
    partial_line: Vec<u8>,
    /// The partial line outgrew the bound and lost its tail.
    partial_line_truncated: bool,
    /// The event's data lines so far (joined by `\n`), when they cannot stay a slice of the frame.
    data: Vec<u8>,
    /// The event's single data line as a range of the current frame (the zero-copy case).
    data_in_frame: Option<(usize, usize)>,
    /// How many `data` lines the current event has.
    data_lines: usize,
    /// The data outgrew the bound.
    data_truncated: bool,
    /// The current event's `event:` type.
    kind: Vec<u8>,
}

// === impl SseScanner ===

impl SseScanner {
    /// A scanner that gathers at most `max_event_bytes` of one event.
    pub fn new(max_event_bytes: usize) -> Self {
        SseScanner {
            max_event_bytes: max_event_bytes.max(1),
            bom_matched: Some(0),
            pending_cr: false,
            partial_line: Vec::new(),
            partial_line_truncated: false,
            data: Vec::new(),
            data_in_frame: None,
            data_lines: 0,
            data_truncated: false,
            kind: Vec::new(),
        }
    }

    /// Scans one frame.
    pub fn feed(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        let mut pos = 0;
        if let Some(matched) = self.bom_matched {
            pos = self.skip_bom(frame, matched);
            if self.bom_matched.is_some() {
                return; // the whole frame was a piece of the BOM
            }
        }
        if self.pending_cr && pos < frame.len() {
            self.pending_cr = false;
            if frame[pos] == b'\n' {
                pos += 1;
            }
        }
        while pos < frame.len() {
            let rest = &frame[pos..];
            let Some(i) = memchr::memchr2(b'\n', b'\r', rest) else {
                self.carry_partial(rest);
                break;
            };
            let end = pos + i;
            let mut next = end + 1;
            if frame[end] == b'\r' {
                if next < frame.len() {
                    if frame[next] == b'\n' {
                        next += 1;
                    }
                } else {
                    self.pending_cr = true;
                }
            }
            if self.partial_line.is_empty() && !self.partial_line_truncated {
                self.line(frame, pos, end, sink);
            } else {
                self.carry_partial(&frame[pos..end]);
                let line = std::mem::take(&mut self.partial_line);
                let truncated = std::mem::replace(&mut self.partial_line_truncated, false);
                self.gathered_line(&line, truncated, frame, sink);
                self.partial_line = line;
                self.partial_line.clear();
                release_if_large(&mut self.partial_line);
            }
            pos = next;
        }
        // An event that spans frames cannot keep pointing into this one.
        if let Some((start, end)) = self.data_in_frame.take() {
            self.data.clear();
            self.push_data(&frame[start..end]);
        }
    }

    /// The body ended: an event without its dispatching blank line is dropped (WHATWG).
    pub fn finish(&mut self, _sink: &mut impl EventSink) {
        self.partial_line.clear();
        release_if_large(&mut self.partial_line);
        self.partial_line_truncated = false;
        self.reset_event();
    }

    /// Consumes the start of `frame` that continues a BOM; returns where the content starts.
    fn skip_bom(&mut self, frame: &[u8], mut matched: usize) -> usize {
        let mut pos = 0;
        while matched < BOM.len() && pos < frame.len() {
            if frame[pos] != BOM[matched] {
                // Not a BOM after all: the bytes taken so far are content of the first line.
                self.bom_matched = None;
                self.carry_partial(&BOM[..matched]);
                return pos;
            }
            matched += 1;
            pos += 1;
        }
        self.bom_matched = if matched == BOM.len() {
            None
        } else {
            Some(matched)
        };
        pos
    }

    /// Keeps a piece of an unfinished line, up to the bound.
    fn carry_partial(&mut self, piece: &[u8]) {
        let room = self.max_event_bytes.saturating_sub(self.partial_line.len());
        if piece.len() > room {
            self.partial_line_truncated = true;
        }
        self.partial_line
            .extend_from_slice(&piece[..piece.len().min(room)]);
    }

    /// A line that lies whole inside `frame` at `start..end`.
    fn line(&mut self, frame: &[u8], start: usize, end: usize, sink: &mut impl EventSink) {
        if end - start > self.max_event_bytes {
            // Cut the way a line gathered across frames is cut, so framing never changes events.
            let line = &frame[start..start + self.max_event_bytes];
            return self.gathered_line(line, true, frame, sink);
        }
        let line = &frame[start..end];
        if line.is_empty() {
            return self.dispatch(frame, sink);
        }
        if line[0] == b':' {
            return;
        }
        let (name, value_start) = split_field(line);
        if name == b"data" && self.data_lines == 0 && !self.data_truncated {
            self.data_in_frame = Some((start + value_start, end));
            self.data_lines = 1;
            return;
        }
        self.field(name, &line[value_start..], false, frame, sink);
    }

    /// A line that was gathered across frames.
    fn gathered_line(
        &mut self,
        line: &[u8],
        truncated: bool,
        frame: &[u8],
        sink: &mut impl EventSink,
    ) {
        if line.is_empty() {
            return self.dispatch(frame, sink);
        }
        if line[0] == b':' {
            return;
        }
        let (name, value_start) = split_field(line);
        self.field(name, &line[value_start..], truncated, frame, sink);
    }

    fn field(
        &mut self,
        name: &[u8],
        value: &[u8],
        truncated: bool,
        frame: &[u8],
        sink: &mut impl EventSink,
    ) {
        match name {
            b"data" => {
                if let Some((start, end)) = self.data_in_frame.take() {
                    self.data.clear();
                    self.push_data(&frame[start..end]);
                }
                if self.data_lines > 0 {
                    self.push_data(b"\n");
                }
                self.push_data(value);
                self.data_lines += 1;
                self.data_truncated |= truncated;
            }
            b"event" => {
                self.kind.clear();
                self.kind
                    .extend_from_slice(&value[..value.len().min(MAX_KIND_BYTES)]);
            }
            b"id" | b"retry" => {}
            _ => sink.on_unknown_field(name, value),
        }
    }

    fn push_data(&mut self, bytes: &[u8]) {
        let room = self.max_event_bytes.saturating_sub(self.data.len());
        if bytes.len() > room {
            self.data_truncated = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn dispatch(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        if self.data_lines > 0 {
            let data = match self.data_in_frame {
                Some((start, end)) => &frame[start..end],
                None => &self.data[..],
            };
            sink.on_event(Event {
                kind: &self.kind,
                data,
                truncated: self.data_truncated,
            });
        }
        self.reset_event();
    }

    fn reset_event(&mut self) {
        self.data.clear();
        release_if_large(&mut self.data);
        self.data_in_frame = None;
        self.data_lines = 0;
        self.data_truncated = false;
        self.kind.clear();
    }
}

/// Splits a field line into its name and the offset where its value starts (after the first colon
/// and at most one space).
#[inline]
fn split_field(line: &[u8]) -> (&[u8], usize) {
    match memchr::memchr(b':', line) {
        Some(colon) => {
            let mut value = colon + 1;
            if line.get(value) == Some(&b' ') {
                value += 1;
            }
            (&line[..colon], value)
        }
        None => (line, line.len()),
    }
}

#[cfg(test)]
mod tests {
    use crate::scan::{scan_all, CollectedEvents, Framing, Scanner};

    fn events(body: &[u8]) -> Vec<(String, String)> {
        scan_all(Framing::Sse, body, 1024)
            .events
            .into_iter()
            .map(|(k, d, _)| (String::from_utf8(k).unwrap(), String::from_utf8(d).unwrap()))
            .collect()
    }

    fn pair(kind: &str, data: &str) -> (String, String) {
        (kind.to_string(), data.to_string())
    }

    #[test]
    fn data_with_and_without_the_space() {
        assert_eq!(
            events(b"data:{\"a\":1}\n\ndata: {\"a\":2}\n\ndata:  x\n\n"),
            vec![pair("", "{\"a\":1}"), pair("", "{\"a\":2}"), pair("", " x")]
        );
    }

    #[test]
    fn every_line_end_style() {
        let expected = vec![pair("", "a"), pair("", "b"), pair("", "c")];
        assert_eq!(events(b"data: a\n\ndata: b\n\ndata: c\n\n"), expected);
        assert_eq!(events(b"data: a\r\rdata: b\r\rdata: c\r\r"), expected);
        assert_eq!(
            events(b"data: a\r\n\r\ndata: b\r\n\r\ndata: c\r\n\r\n"),
            expected
        );
        assert_eq!(events(b"data: a\r\n\ndata: b\r\rdata: c\n\r\n"), expected);
    }

    #[test]
    fn multi_line_data_comments_and_event_types() {
        let body = b": keep-alive\n\nevent: content_block_delta\ndata: one\n: mid\ndata: two\nid: 7\nretry: 10\n\n";
        assert_eq!(events(body), vec![pair("content_block_delta", "one\ntwo")]);
    }

    #[test]
    fn empty_data_buffer_dispatches_nothing_but_empty_data_line_does() {
        assert_eq!(events(b"event: ping\n\n: c\n\n"), vec![]);
        assert_eq!(events(b"data:\n\n"), vec![pair("", "")]);
        assert_eq!(events(b"data\n\n"), vec![pair("", "")]);
    }

    #[test]
    fn bom_is_skipped_once_even_when_split() {
        let body = b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n";
        let mut sink = CollectedEvents::default();
        let mut scanner = Scanner::new(Framing::Sse, 1024);
        for byte in body.chunks(1) {
            scanner.feed(byte, &mut sink);
        }
        assert_eq!(
            sink.events.len(),
            1,
            "the second BOM makes an unknown field"
        );
        assert_eq!(sink.events[0].1, b"a");
        assert_eq!(sink.unknown_fields[0].0, b"\xEF\xBB\xBFdata");
    }

    #[test]
    fn a_false_bom_start_is_content() {
        let mut sink = CollectedEvents::default();
        let mut scanner = Scanner::new(Framing::Sse, 1024);
        scanner.feed(b"\xEF", &mut sink);
        scanner.feed(b"x: 1\ndata: a\n\n", &mut sink);
        assert_eq!(
            sink.unknown_fields,
            vec![(b"\xEFx".to_vec(), b"1".to_vec())]
        );
        assert_eq!(sink.events.len(), 1);
    }

    #[test]
    fn cr_at_frame_end_and_lf_at_next_start_are_one_line_end() {
        let mut sink = CollectedEvents::default();
        let mut scanner = Scanner::new(Framing::Sse, 1024);
        scanner.feed(b"data: a\r", &mut sink);
        scanner.feed(b"\ndata: b\r", &mut sink);
        scanner.feed(b"\n\r", &mut sink);
        scanner.feed(b"\n", &mut sink);
        assert_eq!(sink.events.len(), 1);
        assert_eq!(sink.events[0].1, b"a\nb");
    }

    #[test]
    fn unknown_fields_are_reported() {
        let mut sink = CollectedEvents::default();
        let mut scanner = Scanner::new(Framing::Sse, 1024);
        scanner.feed(b"error: {\"code\":500}\n\n", &mut sink);
        assert_eq!(
            sink.unknown_fields,
            vec![(b"error".to_vec(), b"{\"code\":500}".to_vec())]
        );
        assert!(sink.events.is_empty());
    }

    #[test]
    fn an_oversized_event_is_counted_truncated_and_memory_stays_bounded() {
        let mut sink = CollectedEvents::default();
        let mut scanner = Scanner::new(Framing::Sse, 64);
        scanner.feed(b"data: ", &mut sink);
        for _ in 0..1000 {
            scanner.feed(&[b'x'; 1000], &mut sink);
        }
        if let Scanner::Sse(s) = &scanner {
            assert!(s.partial_line.capacity() <= 1024);
        }
        scanner.feed(b"\n\ndata: ok\n\n", &mut sink);
        assert_eq!(sink.events.len(), 2);
        assert!(sink.events[0].2, "the long event is marked truncated");
        assert_eq!(sink.events[0].1.len(), 64 - 6);
        assert_eq!(sink.events[1], (vec![], b"ok".to_vec(), false));
    }

    #[test]
    fn incomplete_event_at_the_end_is_dropped() {
        assert_eq!(events(b"data: a\n\ndata: b\n"), vec![pair("", "a")]);
    }

    #[test]
    fn a_long_event_gives_its_buffers_back_once_done() {
        let mut scanner = super::SseScanner::new(1 << 20);
        let mut sink = CollectedEvents::default();
        let long = format!("data: {}\n", "x".repeat(100_000));
        // Split mid-line and across two data lines: both buffers grow to the event's size.
        let body = format!("{long}{long}\n");
        let (a, b) = body.as_bytes().split_at(50_000);
        scanner.feed(a, &mut sink);
        assert!(scanner.partial_line.capacity() >= 49_000);
        scanner.feed(b, &mut sink);
        assert_eq!(sink.events.len(), 1);
        assert_eq!(sink.events[0].1.len(), 200_001);
        assert!(scanner.partial_line.capacity() <= super::super::KEEP_CAPACITY);
        assert!(scanner.data.capacity() <= super::super::KEEP_CAPACITY);
        // Usual events keep their (small) buffers: no allocation per event.
        scanner.feed(b"data: {\"a\"", &mut sink);
        scanner.feed(b":1}\n\n", &mut sink);
        let kept = scanner.partial_line.capacity();
        assert!(kept > 0);
        scanner.feed(b"data: {\"a\"", &mut sink);
        scanner.feed(b":2}\n\n", &mut sink);
        assert_eq!(scanner.partial_line.capacity(), kept);
        assert_eq!(sink.events.len(), 3);
    }
}
