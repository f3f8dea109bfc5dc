//! The incremental reader of one direction: frame headers (whole, or carried across reads),
//! payloads (borrowed, or unmasked and inflated into the reader's own bounded buffer), messages
//! put together from their fragments, control frames between them.

use super::frame::{self, FrameHeader, Opcode, PartialHeader, MAX_CONTROL_PAYLOAD};
use super::inflate::Inflater;
use super::mask::unmask;
use super::{
    CloseFrame, Control, ControlFrame, DeflateParams, Direction, Extensions, FrameAt, Limits,
    Message, MessageKind, MessageSink, ReadError,
};

/// A message buffer that grew beyond this for one long message is given back once that message
/// is done: a direction holds up to `max_message_bytes` only while a long message lasts. Messages
/// of usual size never reach it, so the common case allocates nothing after the first message.
const KEEP_CAPACITY: usize = 4096;

/// The stack scratch a masked compressed payload is unmasked into, a piece at a time, on its way
/// to the inflater.
const UNMASK_SCRATCH: usize = 1024;

/// Reads the frames of one direction of one WebSocket connection as they pass, and reports what
/// they carry to a [`MessageSink`]. See the module's documentation for what it keeps.
#[derive(Debug)]
pub struct FrameReader {
    /// Which way the bytes go: client frames must be masked, server frames must not.
    direction: Direction,
    /// The bounds on what one message may cost.
    limits: Limits,
    /// Bytes fed so far: the offset of the next byte in the direction's stream.
    offset: u64,
    /// Where in the framing the next byte falls.
    state: State,
    /// The first bytes of a header a feed cut short.
    header: PartialHeader,
    /// The data message whose frames are being read, if one is open.
    message: Option<OpenMessage>,
    /// The open message's bytes so far (unmasked, inflated), at most `max_message_bytes`.
    buf: Vec<u8>,
    /// A control frame's payload gathered across feeds, or unmasked.
    control: ControlPayload,
    /// `permessage-deflate`'s inflater, when the handshake negotiated it.
    inflater: Option<Inflater>,
}

/// Where in the framing the next byte falls: a state per case, so none that cannot happen can
/// be represented.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Between frames, or inside a header whose first bytes are in `header`.
    Header,
    /// Inside a frame's payload.
    Payload(InFrame),
    /// A close frame was read: nothing may follow it.
    Closed,
    /// The reading stopped for good; bytes are counted and nothing else.
    Stopped(ReadError),
}

/// The frame whose payload is being read.
#[derive(Debug, Clone, Copy)]
struct InFrame {
    header: FrameHeader,
    /// The offset of its first header byte.
    start: u64,
    /// Payload bytes read so far.
    read: u64,
}

// === impl InFrame ===

impl InFrame {
    fn end(&self) -> u64 {
        self.start + u64::from(self.header.header_len) + self.header.payload_len
    }

    fn remaining(&self) -> u64 {
        self.header.payload_len - self.read
    }
}

/// What is known of the open data message before its last frame.
#[derive(Debug, Clone, Copy)]
struct OpenMessage {
    kind: MessageKind,
    compressed: bool,
    start: u64,
    frames: u32,
    wire_len: u64,
    /// Its payload passed `max_message_bytes` (uncompressed messages; the inflater knows for
    /// compressed ones).
    oversize: bool,
}

/// A control frame's payload, at most 125 bytes, kept inline.
#[derive(Debug, Clone, Copy)]
struct ControlPayload {
    bytes: [u8; MAX_CONTROL_PAYLOAD],
    len: u8,
}

// === impl ControlPayload ===

impl ControlPayload {
    /// Appends a piece of the payload, which starts at payload offset `offset`, unmasked.
    fn push(&mut self, piece: &[u8], mask: Option<[u8; 4]>, offset: u64) {
        let at = usize::from(self.len);
        let into = &mut self.bytes[at..at + piece.len()];
        into.copy_from_slice(piece);
        if let Some(key) = mask {
            unmask(into, key, offset);
        }
        self.len += piece.len() as u8;
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// What one step of a feed took, or the error and the offset of the frame it stopped at.
type Step = Result<usize, (ReadError, u64)>;

// === impl FrameReader ===

impl FrameReader {
    /// A reader of `direction`, with `deflate` the `permessage-deflate` parameters if the
    /// handshake negotiated it.
    pub fn new(direction: Direction, deflate: Option<DeflateParams>, limits: Limits) -> Self {
        FrameReader {
            direction,
            limits,
            offset: 0,
            state: State::Header,
            header: PartialHeader::default(),
            message: None,
            buf: Vec::new(),
            control: ControlPayload {
                bytes: [0; MAX_CONTROL_PAYLOAD],
                len: 0,
            },
            inflater: deflate
                .map(|p| Inflater::new(p.window_bits(direction), p.context_takeover(direction))),
        }
    }

    /// A reader for what the handshake negotiated; `None` when an extension the reader does not
    /// know changes the frames, so the connection is to be tunnelled unread.
    pub fn for_extensions(
        direction: Direction,
        extensions: &Extensions,
        limits: Limits,
    ) -> Option<Self> {
        match extensions {
            Extensions::None => Some(FrameReader::new(direction, None, limits)),
            Extensions::PerMessageDeflate(p) => Some(FrameReader::new(direction, Some(*p), limits)),
            Extensions::Unsupported => None,
        }
    }

    /// Reads the next bytes of the direction, exactly as they pass, reporting to `sink` every
    /// message, control frame and header that they complete. The bytes are only read.
    pub fn feed(&mut self, bytes: &[u8], sink: &mut impl MessageSink) {
        let base = self.offset;
        self.offset += bytes.len() as u64;
        let mut pos = 0;
        while pos < bytes.len() {
            let at = base + pos as u64;
            let rest = &bytes[pos..];
            let step = match self.state {
                State::Header => self.read_header(rest, at, sink),
                State::Payload(frame) => self.read_payload(frame, rest, sink),
                State::Closed => Err((ReadError::DataAfterClose, at)),
                State::Stopped(_) => return,
            };
            match step {
                Ok(taken) => pos += taken,
                Err((error, at)) => {
                    self.stop(error);
                    sink.on_stop(&error, at);
                    return;
                }
            }
        }
    }

    /// Bytes fed so far: the offset the next fed byte has in the direction's stream.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Why the reader stopped, if it did; it then reads nothing more.
    pub fn stopped(&self) -> Option<ReadError> {
        match self.state {
            State::Stopped(error) => Some(error),
            _ => None,
        }
    }

    /// The bytes fed so far end at a frame boundary (between frames, no header begun), so a
    /// frame written next into the same direction would be read as a frame of its own: where a
    /// tunnel may add its own close frame. False once the reading stopped.
    pub fn at_frame_boundary(&self) -> bool {
        matches!(self.state, State::Header | State::Closed) && self.header.is_empty()
    }

    /// A close frame was read: the direction's sender has begun the closing handshake.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Reads a header at the start of `rest` (whole, or completing the kept part) and begins
    /// its frame.
    fn read_header(&mut self, rest: &[u8], at: u64, sink: &mut impl MessageSink) -> Step {
        let deflate = self.inflater.is_some();
        let (header, taken, start) = if self.header.is_empty()
            && rest.len() >= 2
            && rest.len() >= frame::header_len(rest[1])
        {
            let header = frame::parse(rest, self.direction, deflate).map_err(|e| (e, at))?;
            (header, usize::from(header.header_len), at)
        } else {
            let taken = self.header.fill(rest);
            if !self.header.is_complete() {
                return Ok(taken);
            }
            let start = at + taken as u64 - self.header.bytes().len() as u64;
            let parsed = frame::parse(self.header.bytes(), self.direction, deflate);
            self.header.clear();
            (parsed.map_err(|e| (e, start))?, taken, start)
        };
        let frame = InFrame {
            header,
            start,
            read: 0,
        };
        self.begin_frame(frame, sink).map_err(|e| (e, start))?;
        Ok(taken)
    }

    /// Checks a data frame against the open message (RFC 6455 §5.4), reports the header, and
    /// ends at once a frame without payload.
    fn begin_frame(
        &mut self,
        frame: InFrame,
        sink: &mut impl MessageSink,
    ) -> Result<(), ReadError> {
        let header = frame.header;
        let kind = match header.opcode {
            Opcode::Text => Some(MessageKind::Text),
            Opcode::Binary => Some(MessageKind::Binary),
            _ => None,
        };
        if let Some(kind) = kind {
            if self.message.is_some() {
                return Err(ReadError::MessageInterrupted);
            }
            self.message = Some(OpenMessage {
                kind,
                compressed: header.rsv1,
                start: frame.start,
                frames: 1,
                wire_len: 0,
                oversize: false,
            });
        } else if header.opcode == Opcode::Continuation {
            let message = self
                .message
                .as_mut()
                .ok_or(ReadError::UnexpectedContinuation)?;
            message.frames = message.frames.saturating_add(1);
        }
        sink.on_frame(FrameAt {
            header,
            start: frame.start,
            end: frame.end(),
        });
        if header.payload_len == 0 {
            self.state = State::Header;
            self.end_frame(frame, Some(&[]), sink)
        } else {
            self.state = State::Payload(frame);
            Ok(())
        }
    }

    /// Reads what `rest` holds of the current frame's payload. A frame that is a whole message
    /// by itself (or a control frame), lies whole in `rest` and needs no unmasking or
    /// inflating is reported as a slice of `rest`; anything else goes through the buffers.
    fn read_payload(
        &mut self,
        mut frame: InFrame,
        rest: &[u8],
        sink: &mut impl MessageSink,
    ) -> Step {
        let header = frame.header;
        let taken = frame.remaining().min(rest.len() as u64) as usize;
        let piece = &rest[..taken];
        let is_control = header.opcode.is_control();
        if !is_control {
            if let Some(message) = self.message.as_mut() {
                message.wire_len += taken as u64;
            }
        }
        let stands_alone =
            is_control || (header.fin && header.opcode != Opcode::Continuation && !header.rsv1);
        let ended = if frame.read == 0
            && taken as u64 == header.payload_len
            && header.mask.is_none()
            && stands_alone
        {
            self.state = State::Header;
            self.end_frame(frame, Some(piece), sink)
        } else {
            let mut read = Ok(());
            if is_control {
                self.control.push(piece, header.mask, frame.read);
            } else {
                read = self.data_piece(&frame, piece);
            }
            frame.read += taken as u64;
            if read.is_ok() && frame.remaining() == 0 {
                self.state = State::Header;
                self.end_frame(frame, None, sink)
            } else {
                self.state = State::Payload(frame);
                read
            }
        };
        ended.map(|()| taken).map_err(|e| (e, frame.start))
    }

    /// Takes a piece of a data frame's payload into the message buffer: unmasked, and inflated
    /// when the message is compressed, up to the bound.
    fn data_piece(&mut self, frame: &InFrame, piece: &[u8]) -> Result<(), ReadError> {
        let Some(message) = self.message.as_mut() else {
            return Ok(());
        };
        let mask = frame.header.mask;
        if !message.compressed {
            let room = self.limits.max_message_bytes.saturating_sub(self.buf.len());
            let take = room.min(piece.len());
            message.oversize |= take < piece.len();
            let kept = self.buf.len();
            self.buf.extend_from_slice(&piece[..take]);
            if let Some(key) = mask {
                unmask(&mut self.buf[kept..], key, frame.read);
            }
            return Ok(());
        }
        let Some(inflater) = self.inflater.as_mut() else {
            return Ok(());
        };
        let Some(key) = mask else {
            return inflater.feed(piece, &mut self.buf, &self.limits);
        };
        if inflater.is_skipping() {
            return Ok(());
        }
        let mut scratch = [0; UNMASK_SCRATCH];
        let mut offset = frame.read;
        for part in piece.chunks(UNMASK_SCRATCH) {
            let unmasked = &mut scratch[..part.len()];
            unmasked.copy_from_slice(part);
            unmask(unmasked, key, offset);
            inflater.feed(unmasked, &mut self.buf, &self.limits)?;
            offset += part.len() as u64;
        }
        Ok(())
    }

    /// The frame's last payload byte was read; `whole` is its payload when it lay whole in one
    /// feed and needed no unmasking.
    fn end_frame(
        &mut self,
        frame: InFrame,
        whole: Option<&[u8]>,
        sink: &mut impl MessageSink,
    ) -> Result<(), ReadError> {
        let end = frame.end();
        let opcode = frame.header.opcode;
        if opcode.is_control() {
            let payload = whole.unwrap_or(self.control.bytes());
            let control = match opcode {
                Opcode::Ping => Control::Ping(payload),
                Opcode::Pong => Control::Pong(payload),
                _ => Control::Close(close_frame(payload)?),
            };
            sink.on_control(ControlFrame {
                control,
                start: frame.start,
                end,
            });
            self.control.len = 0;
            if opcode == Opcode::Close {
                self.state = State::Closed;
            }
            return Ok(());
        }
        if !frame.header.fin {
            return Ok(());
        }
        let Some(message) = self.message.take() else {
            return Ok(());
        };
        let max = self.limits.max_message_bytes;
        let (data, oversize) = match whole {
            Some(payload) if message.frames == 1 && !message.compressed => {
                (&payload[..payload.len().min(max)], payload.len() > max)
            }
            _ => {
                let mut oversize = message.oversize;
                if let (true, Some(inflater)) = (message.compressed, self.inflater.as_mut()) {
                    oversize |= inflater.finish(&mut self.buf, &self.limits)?;
                }
                (&self.buf[..], oversize)
            }
        };
        sink.on_message(Message {
            kind: message.kind,
            data,
            oversize,
            compressed: message.compressed,
            frames: message.frames,
            wire_len: message.wire_len,
            start: message.start,
            end,
        });
        self.buf.clear();
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Stops for good, giving back what the reading held.
    fn stop(&mut self, error: ReadError) {
        self.state = State::Stopped(error);
        self.message = None;
        self.buf = Vec::new();
        self.inflater = None;
        self.header.clear();
    }
}

/// A close frame's payload: empty, or a status code an endpoint may send and a UTF-8 reason
/// (RFC 6455 §5.5.1, §7.4).
fn close_frame(payload: &[u8]) -> Result<Option<CloseFrame<'_>>, ReadError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ReadError::CloseTooShort),
        [high, low, reason @ ..] => {
            let code = u16::from_be_bytes([*high, *low]);
            if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
                return Err(ReadError::InvalidCloseCode(code));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| ReadError::CloseReasonNotUtf8)?;
            Ok(Some(CloseFrame { code, reason }))
        }
    }
}

#[cfg(test)]
mod tests;
