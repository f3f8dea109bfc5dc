//! WebSocket frames read as they pass through a tunnel (RFC 6455), with `permessage-deflate`
//! inflated for reading only (RFC 7692).
//!
//! A [`FrameReader`] reads one direction of one connection. It is fed that direction's bytes
//! exactly as they pass, split anywhere (a header across two reads, many frames in one), and
//! reports each complete message, control frame and frame header to a [`MessageSink`], as the
//! scanners of `scan` report SSE events. It only reads: the bytes the tunnel forwards are never
//! written, unmasked or inflated in place; what it unmasks or inflates goes into its own bounded
//! buffer.
//!
//! Memory is bounded per direction: at most a 14-byte partial header, a 125-byte control
//! payload, the first [`Limits::max_message_bytes`] of the message in progress, and, once a
//! compressed message is seen, one inflater with the negotiated window (at most 32 KiB). Past the message bound
//! the reader still follows the framing, so it never loses sync; the message is reported as
//! `oversize` with only its beginning. A protocol error ([`ReadError`]) stops the reading of that
//! direction for good; the tunnel goes on forwarding.
//!
//! A message is reported from within the [`FrameReader::feed`] call whose bytes hold its last
//! byte, so the read (or write) that carried a message is the one being fed when the sink hears
//! of it; [`Message::end`] gives its exact offset in the direction's byte stream.
//!
//! This is a wire-format layer: it depends on std, `thiserror` and `flate2` (zlib-rs) only, never on
//! another module of the crate.

pub mod encode;
mod error;
mod extensions;
mod frame;
mod inflate;
mod mask;
mod reader;

pub use error::ReadError;
pub use extensions::{DeflateParams, ExtensionError, Extensions};
pub use frame::{FrameHeader, Opcode, MAX_HEADER_LEN};
pub use reader::FrameReader;

/// Default bound on the bytes of one message a reader keeps (64 KiB, as the scanners' bound on an
/// event).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Default bound on what one compressed message may inflate to when the sender keeps its
/// compression context (16 MiB): the reader must inflate all of such a message, kept or not, to
/// read the next one, so this bounds the work one message can cost (about 20 ms of inflating).
pub const DEFAULT_MAX_INFLATED_BYTES: u64 = 16 * 1024 * 1024;

/// Which way a direction's bytes go. Client frames are masked and server frames are not
/// (RFC 6455 §5.1), and each way has its own `permessage-deflate` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client to the server: every frame masked.
    ClientToServer,
    /// From the server to the client: no frame masked.
    ServerToClient,
}

/// The bounds of one reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes of a message (unmasked, inflated) handed to the sink; a longer message is
    /// reported `oversize` with its beginning.
    pub max_message_bytes: usize,
    /// The most bytes one compressed message may inflate to when its sender keeps the compression
    /// context; past it the reader stops ([`ReadError::InflateBudget`]). Without context takeover
    /// an oversize message is not inflated past `max_message_bytes`, so this does not apply.
    pub max_inflated_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_inflated_bytes: DEFAULT_MAX_INFLATED_BYTES,
        }
    }
}

/// Whether a data message is text or binary (its first frame's opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// Opcode 0x1: UTF-8 text (not checked here: a reader of JSON checks it anyway).
    Text,
    /// Opcode 0x2: bytes.
    Binary,
}

/// One complete data message, or the beginning of an oversize one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Text or binary.
    pub kind: MessageKind,
    /// The message's bytes, unmasked and inflated: a slice of the fed bytes when the message is
    /// one unmasked, uncompressed frame inside one feed, else the reader's own buffer.
    pub data: &'a [u8],
    /// True when the message is longer than [`Limits::max_message_bytes`]: `data` holds only its
    /// beginning, so it is counted but must not be parsed as whole.
    pub oversize: bool,
    /// True when the message was compressed with `permessage-deflate`.
    pub compressed: bool,
    /// How many frames carried it (fragmentation; control frames between them not counted).
    pub frames: u32,
    /// Its payload bytes on the wire, all frames together (compressed size when compressed).
    pub wire_len: u64,
    /// The offset of its first frame's first header byte in the direction's byte stream.
    pub start: u64,
    /// The offset just past its last byte: the message arrived with the feed that took the
    /// stream past this offset.
    pub end: u64,
}

/// What a control frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control<'a> {
    /// A ping and its application data.
    Ping(&'a [u8]),
    /// A pong and its application data.
    Pong(&'a [u8]),
    /// A close frame: its status code and reason, or `None` for an empty payload.
    Close(Option<CloseFrame<'a>>),
}

/// The status code and reason of a close frame (RFC 6455 §5.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseFrame<'a> {
    /// The status code (1000 normal closure, 1001 going away, 3000 to 4999 the application's).
    pub code: u16,
    /// The reason, UTF-8 checked.
    pub reason: &'a str,
}

/// One control frame and where it lay in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlFrame<'a> {
    /// What it says.
    pub control: Control<'a>,
    /// The offset of its first header byte.
    pub start: u64,
    /// The offset just past its last byte.
    pub end: u64,
}

/// One frame's header and where the frame lies in the byte stream, reported when the header has
/// been read, before its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameAt {
    /// The header as read (checked).
    pub header: FrameHeader,
    /// The offset of its first header byte.
    pub start: u64,
    /// The offset just past its payload's last byte.
    pub end: u64,
}

/// Receives what a reader finds. Called synchronously from [`FrameReader::feed`], so everything
/// reported during one feed ended in the bytes of that feed.
pub trait MessageSink {
    /// A complete data message (or an oversize one's beginning).
    fn on_message(&mut self, message: Message<'_>);

    /// A complete control frame; a close frame is the last thing a direction reports.
    fn on_control(&mut self, _control: ControlFrame<'_>) {}

    /// A frame's header, as soon as it is read: for a caller that times frames, not messages.
    fn on_frame(&mut self, _frame: FrameAt) {}

    /// The reader stopped at the frame starting at offset `at`: it reports nothing more, and the
    /// same error stays readable from [`FrameReader::stopped`].
    fn on_stop(&mut self, _error: &ReadError, _at: u64) {}
}

/// One thing a reader reported, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collected {
    /// A message, as [`Message`] reports it.
    Message {
        /// Text or binary.
        kind: MessageKind,
        /// Its (first) bytes.
        data: Vec<u8>,
        /// Longer than the bound.
        oversize: bool,
        /// Compressed on the wire.
        compressed: bool,
        /// Frames that carried it.
        frames: u32,
        /// Payload bytes on the wire.
        wire_len: u64,
        /// Offset of its first byte.
        start: u64,
        /// Offset past its last byte.
        end: u64,
    },
    /// A ping's data.
    Ping(Vec<u8>),
    /// A pong's data.
    Pong(Vec<u8>),
    /// A close frame's code and reason.
    Close(Option<(u16, String)>),
    /// The reader stopped at a frame starting at this offset.
    Stopped(ReadError, u64),
}

/// A sink that keeps owned copies of everything reported: for tests, fuzzing and one-shot
/// reads, never for the tunnel's hot path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CollectedEvents {
    /// Messages, control frames and the stop, in the order reported.
    pub events: Vec<Collected>,
    /// Every frame header reported, in order.
    pub frames: Vec<FrameAt>,
}

impl MessageSink for CollectedEvents {
    fn on_message(&mut self, m: Message<'_>) {
        self.events.push(Collected::Message {
            kind: m.kind,
            data: m.data.to_vec(),
            oversize: m.oversize,
            compressed: m.compressed,
            frames: m.frames,
            wire_len: m.wire_len,
            start: m.start,
            end: m.end,
        });
    }

    fn on_control(&mut self, c: ControlFrame<'_>) {
        self.events.push(match c.control {
            Control::Ping(data) => Collected::Ping(data.to_vec()),
            Control::Pong(data) => Collected::Pong(data.to_vec()),
            Control::Close(close) => {
                Collected::Close(close.map(|c| (c.code, c.reason.to_string())))
            }
        });
    }

    fn on_frame(&mut self, frame: FrameAt) {
        self.frames.push(frame);
    }

    fn on_stop(&mut self, error: &ReadError, at: u64) {
        self.events.push(Collected::Stopped(*error, at));
    }
}

/// Reads a whole direction in one call and returns what it reported: the reference the
/// incremental read is checked against.
pub fn read_all(
    direction: Direction,
    deflate: Option<DeflateParams>,
    limits: Limits,
    bytes: &[u8],
) -> CollectedEvents {
    let mut sink = CollectedEvents::default();
    FrameReader::new(direction, deflate, limits).feed(bytes, &mut sink);
    sink
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod python_fixtures;
