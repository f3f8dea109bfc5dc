//! Newline-delimited JSON: one event per line (`\n`, with an optional `\r` before it); blank lines
//! are skipped. Ollama's native API streams this way.

use super::{release_if_large, Event, EventSink};

/// Incremental NDJSON line scanner. Memory: at most `max_event_bytes` of one partial line.
#[derive(Debug)]
pub struct NdjsonScanner {
    /// The bound on a carried partial line.
    max_event_bytes: usize,
    /// A line that a frame ended in the middle of.
    partial_line: Vec<u8>,
    /// The partial line outgrew the bound and lost its tail.
    truncated: bool,
}

// === impl NdjsonScanner ===

impl NdjsonScanner {
    /// A scanner that gathers at most `max_event_bytes` of one line.
    pub fn new(max_event_bytes: usize) -> Self {
        NdjsonScanner {
            max_event_bytes: max_event_bytes.max(1),
            partial_line: Vec::new(),
            truncated: false,
        }
    }

    /// Scans one frame.
    pub fn feed(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        let mut pos = 0;
        while pos < frame.len() {
            let rest = &frame[pos..];
            let Some(i) = memchr::memchr(b'\n', rest) else {
                self.carry(rest);
                break;
            };
            if self.partial_line.is_empty() && !self.truncated {
                self.emit_bounded(&rest[..i], sink);
            } else {
                self.carry(&rest[..i]);
                emit(&self.partial_line, self.truncated, sink);
                self.partial_line.clear();
                release_if_large(&mut self.partial_line);
                self.truncated = false;
            }
            pos += i + 1;
        }
    }

    /// The body ended: a last line without its newline is still an event.
    pub fn finish(&mut self, sink: &mut impl EventSink) {
        emit(&self.partial_line, self.truncated, sink);
        self.partial_line.clear();
        release_if_large(&mut self.partial_line);
        self.truncated = false;
    }

    /// A line that lies whole in one frame, cut the way a gathered line would be.
    fn emit_bounded(&self, line: &[u8], sink: &mut impl EventSink) {
        if line.len() > self.max_event_bytes {
            emit(&line[..self.max_event_bytes], true, sink);
        } else {
            emit(line, false, sink);
        }
    }

    fn carry(&mut self, piece: &[u8]) {
        let room = self.max_event_bytes.saturating_sub(self.partial_line.len());
        if piece.len() > room {
            self.truncated = true;
        }
        self.partial_line
            .extend_from_slice(&piece[..piece.len().min(room)]);
    }
}

fn emit(line: &[u8], truncated: bool, sink: &mut impl EventSink) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    sink.on_event(Event {
        kind: b"",
        data: line,
        truncated,
    });
}

#[cfg(test)]
mod tests {
    use crate::scan::{scan_all, Framing};

    #[test]
    fn lines_blank_lines_crlf_and_a_last_line_without_newline() {
        let got = scan_all(
            Framing::Ndjson,
            b"{\"a\":1}\r\n\n  \n{\"a\":2}\n{\"a\":3}",
            1024,
        );
        let data: Vec<_> = got.events.iter().map(|e| e.1.clone()).collect();
        assert_eq!(
            data,
            vec![
                b"{\"a\":1}".to_vec(),
                b"{\"a\":2}".to_vec(),
                b"{\"a\":3}".to_vec()
            ]
        );
    }

    #[test]
    fn a_long_line_is_truncated_and_flagged() {
        let mut body = vec![b'x'; 100];
        body.extend_from_slice(b"\n{}\n");
        let got = scan_all(Framing::Ndjson, &body, 10);
        assert_eq!(got.events[0].1.len(), 10);
        assert!(got.events[0].2);
        assert_eq!(got.events[1], (vec![], b"{}".to_vec(), false));
    }

    #[test]
    fn a_long_line_gives_its_buffer_back_once_done() {
        let mut scanner = super::NdjsonScanner::new(1 << 20);
        let mut sink = crate::scan::CollectedEvents::default();
        let line = format!("{{\"x\":\"{}\"}}\n", "y".repeat(100_000));
        let (a, b) = line.as_bytes().split_at(60_000);
        scanner.feed(a, &mut sink);
        assert!(scanner.partial_line.capacity() >= 60_000);
        scanner.feed(b, &mut sink);
        assert_eq!(sink.events.len(), 1);
        assert!(scanner.partial_line.capacity() <= super::super::KEEP_CAPACITY);
        scanner.feed(&line.as_bytes()[..60_000], &mut sink);
        scanner.finish(&mut sink);
        assert_eq!(sink.events.len(), 2);
        assert!(scanner.partial_line.capacity() <= super::super::KEEP_CAPACITY);
    }
}
