//! The response's bytes on their way to the client socket: the head, then each body frame with
//! its framing (a chunk-size line and CRLF around it, or nothing under a declared length),
//! written with one vectored write for as many pieces as are waiting.
//!
//! This is the part of hyper's server a streamed frame passes through, without its queue of
//! boxed buffers and its formatter: a frame's chunk-size line is a few bytes on the writer's own
//! array (`http1::encode::ChunkSize`, which the upstream client writes request chunks with too), the frame's `Bytes` are the very ones the upstream read, and nothing is copied or
//! allocated per frame (the list of pieces is kept for the connection's life).

// IoSlice reinterpretation; each block says why it is sound.
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::head::Framing;
use crate::http1::encode::{ChunkSize, CHUNK_END, LAST_CHUNK};

/// The most pieces one vectored write takes (Linux takes up to 1,024; each frame is at most 3).
const MAX_SLICES: usize = 48;

/// One piece of the response.
#[derive(Debug)]
enum Piece {
    /// The response head.
    Head(Vec<u8>),
    /// A body frame's bytes.
    Data(Bytes),
    /// A chunk-size line: hexadecimal digits and CRLF.
    Size(ChunkSize),
    /// Framing text: a chunk's CRLF, the last chunk.
    Text(&'static [u8]),
}

// === impl Piece ===

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Head(head) => head,
            Piece::Data(data) => data,
            Piece::Size(line) => line.as_bytes(),
            Piece::Text(text) => text,
        }
    }
}

/// A body that broke its own framing: more or fewer bytes than its declared length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("the response body is longer than its content-length")]
    TooLong,
    #[error("the response body ended before its content-length")]
    TooShort,
}

/// The pieces waiting for the socket, and the body's framing.
#[derive(Debug)]
pub struct Writer {
    pieces: Vec<Piece>,
    /// Pieces before this one are written.
    first: usize,
    /// Bytes of `pieces[first]` already written.
    offset: usize,
    framing: Framing,
    /// Body bytes still to come under a declared length.
    remaining: u64,
    /// Body bytes waiting in `pieces`.
    queued: usize,
}

// === impl Writer ===

impl Writer {
    /// A writer with nothing waiting.
    pub fn new() -> Self {
        Writer {
            pieces: Vec::new(),
            first: 0,
            offset: 0,
            framing: Framing::None,
            remaining: 0,
            queued: 0,
        }
    }

    /// Starts a response: its head, and how its body is framed.
    pub fn start(&mut self, head: Vec<u8>, framing: Framing) {
        self.framing = framing;
        self.remaining = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        self.pieces.push(Piece::Head(head));
    }

    /// Queues a body frame with its framing.
    pub fn data(&mut self, data: Bytes) -> Result<(), FramingError> {
        if data.is_empty() {
            return Ok(());
        }
        match self.framing {
            Framing::None => return Ok(()),
            Framing::Length(_) => {
                let len = data.len() as u64;
                if len > self.remaining {
                    return Err(FramingError::TooLong);
                }
                self.remaining -= len;
                self.queued += data.len();
                self.pieces.push(Piece::Data(data));
            }
            Framing::Chunked => {
                self.queued += data.len();
                self.pieces.push(Piece::Size(ChunkSize::new(data.len())));
                self.pieces.push(Piece::Data(data));
                self.pieces.push(Piece::Text(CHUNK_END));
            }
            Framing::UntilClose => {
                self.queued += data.len();
                self.pieces.push(Piece::Data(data));
            }
        }
        Ok(())
    }

    /// Whether a declared length has been reached: the body needs no more frames.
    pub fn length_reached(&self) -> bool {
        matches!(self.framing, Framing::Length(_)) && self.remaining == 0
    }

    /// Queues the body's end (the last chunk under chunked coding).
    pub fn end(&mut self) -> Result<(), FramingError> {
        match self.framing {
            Framing::Chunked => self.pieces.push(Piece::Text(LAST_CHUNK)),
            Framing::Length(_) if self.remaining > 0 => return Err(FramingError::TooShort),
            _ => {}
        }
        Ok(())
    }

    /// Whether nothing waits for the socket.
    pub fn is_empty(&self) -> bool {
        self.first == self.pieces.len()
    }

    /// Body bytes waiting for the socket (so the connection stops taking frames past a bound).
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Writes what waits, as much as the socket takes; ready once it is all written and
    /// flushed.
    pub fn poll_write<I: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut I,
    ) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            // Only the slices used are written to: this array and the read probe's, zeroed on
            // every poll, cost about 280 instructions per metered event (docs/perf-history.md,
            // "an HTTP/1.1 server of metronome's own": 6,166 -> 5,887 by
            // scripts/instructions-per-event.sh).
            let mut slices = [const { MaybeUninit::<IoSlice<'_>>::uninit() }; MAX_SLICES];
            let mut count = 0;
            for (slot, piece) in slices.iter_mut().zip(&self.pieces[self.first..]) {
                let bytes = piece.bytes();
                let bytes = if count == 0 {
                    &bytes[self.offset..]
                } else {
                    bytes
                };
                slot.write(IoSlice::new(bytes));
                count += 1;
            }
            // SAFETY: the first `count` elements were written just above, and `MaybeUninit<T>`
            // has `T`'s layout.
            let slices =
                unsafe { std::slice::from_raw_parts(slices.as_ptr().cast::<IoSlice<'_>>(), count) };
            let n = std::task::ready!(Pin::new(&mut *io).poll_write_vectored(cx, slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        self.pieces.clear();
        self.first = 0;
        self.offset = 0;
        Pin::new(io).poll_flush(cx)
    }

    /// `n` more bytes were written.
    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let piece = &self.pieces[self.first];
            let left = piece.bytes().len() - self.offset;
            if n < left {
                self.offset += n;
                if let Piece::Data(_) = piece {
                    self.queued -= n;
                }
                return;
            }
            n -= left;
            if let Piece::Data(_) = piece {
                self.queued -= left;
            }
            // Let go of the frame's bytes as soon as they are out.
            self.pieces[self.first] = Piece::Text(b"");
            self.first += 1;
            self.offset = 0;
        }
        // Skip empty pieces so `is_empty` is exact.
        while self.first < self.pieces.len() && self.pieces[self.first].bytes().is_empty() {
            self.first += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A socket that takes at most `max` bytes per write and records them.
    struct Trickle {
        written: Vec<u8>,
        max: usize,
        writes: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.written.extend_from_slice(&buf[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut n = 0;
            for buf in bufs {
                let take = buf.len().min(self.max - n);
                self.written.extend_from_slice(&buf[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            self.writes += 1;
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn drain(writer: &mut Writer, io: &mut Trickle) {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(writer.poll_write(&mut cx, io).is_ready());
        assert!(writer.is_empty());
        assert_eq!(writer.queued_bytes(), 0);
    }

    #[test]
    fn a_chunked_response_is_written_exactly_however_the_socket_cuts_it() {
        for max in [1, 2, 3, 5, 8, 13, 1000] {
            let mut writer = Writer::new();
            let mut io = Trickle {
                written: Vec::new(),
                max,
                writes: 0,
            };
            writer.start(b"HEAD\r\n\r\n".to_vec(), Framing::Chunked);
            writer.data(Bytes::from_static(b"data: one\n\n")).unwrap();
            writer.data(Bytes::new()).unwrap();
            drain(&mut writer, &mut io);
            writer.data(Bytes::from(vec![b'x'; 300])).unwrap();
            writer.end().unwrap();
            drain(&mut writer, &mut io);
            let want = [
                &b"HEAD\r\n\r\nB\r\ndata: one\n\n\r\n12C\r\n"[..],
                &[b'x'; 300],
                b"\r\n0\r\n\r\n",
            ]
            .concat();
            assert_eq!(io.written, want, "max {max}");
        }
    }

    #[test]
    fn the_pieces_that_wait_go_out_in_one_write() {
        let mut writer = Writer::new();
        let mut io = Trickle {
            written: Vec::new(),
            max: usize::MAX,
            writes: 0,
        };
        writer.start(b"H\r\n\r\n".to_vec(), Framing::Chunked);
        for _ in 0..10 {
            writer.data(Bytes::from_static(b"abc")).unwrap();
        }
        assert_eq!(writer.queued_bytes(), 30);
        drain(&mut writer, &mut io);
        assert_eq!(io.writes, 1);
        // More than one write's slices: still all of it, in order.
        for _ in 0..40 {
            writer.data(Bytes::from_static(b"abc")).unwrap();
        }
        drain(&mut writer, &mut io);
        assert_eq!(io.writes, 1 + (120_usize).div_ceil(MAX_SLICES));
        assert_eq!(io.written.len(), 5 + 50 * (3 + 3 + 2));
    }

    #[test]
    fn a_declared_length_is_kept_to() {
        let mut writer = Writer::new();
        let mut io = Trickle {
            written: Vec::new(),
            max: 4,
            writes: 0,
        };
        writer.start(b"H\r\n\r\n".to_vec(), Framing::Length(5));
        writer.data(Bytes::from_static(b"abc")).unwrap();
        assert!(!writer.length_reached());
        assert_eq!(
            writer.data(Bytes::from_static(b"def")),
            Err(FramingError::TooLong)
        );
        assert_eq!(writer.end(), Err(FramingError::TooShort));
        writer.data(Bytes::from_static(b"de")).unwrap();
        assert!(writer.length_reached());
        writer.end().unwrap();
        drain(&mut writer, &mut io);
        assert_eq!(io.written, b"H\r\n\r\nabcde");
    }

    /// The wire a chunked response of `frames` must be, written independently of `Writer`.
    fn chunked_wire(head: &[u8], frames: &[Vec<u8>]) -> Vec<u8> {
        let mut wire = head.to_vec();
        for frame in frames.iter().filter(|f| !f.is_empty()) {
            wire.extend_from_slice(format!("{:X}\r\n", frame.len()).as_bytes());
            wire.extend_from_slice(frame);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        wire
    }

    proptest::proptest! {
        /// Whatever the frames, however many wait at once and however the socket cuts the
        /// writes, the client gets exactly the chunked coding of the frames, in order.
        #[test]
        fn any_frames_are_written_exactly(
            frames in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..60),
            max in 1usize..700,
            batch in 1usize..20,
        ) {
            let mut writer = Writer::new();
            let mut io = Trickle { written: Vec::new(), max, writes: 0 };
            writer.start(b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), Framing::Chunked);
            for group in frames.chunks(batch) {
                for frame in group {
                    writer.data(Bytes::from(frame.clone())).unwrap();
                }
                drain(&mut writer, &mut io);
            }
            writer.end().unwrap();
            drain(&mut writer, &mut io);
            proptest::prop_assert_eq!(io.written, chunked_wire(b"HTTP/1.1 200 OK\r\n\r\n", &frames));
        }
    }

    #[test]
    fn no_body_writes_only_the_head() {
        let mut writer = Writer::new();
        let mut io = Trickle {
            written: Vec::new(),
            max: 100,
            writes: 0,
        };
        writer.start(b"H\r\n\r\n".to_vec(), Framing::None);
        writer.data(Bytes::from_static(b"ignored")).unwrap();
        writer.end().unwrap();
        drain(&mut writer, &mut io);
        assert_eq!(io.written, b"H\r\n\r\n");
    }
}
