//! Frames written, the reader's mirror: for tests, fuzz seeds and benchmarks, which need frames
//! the reader has not seen, and for a server that speaks WebSocket. The tunnel never writes a
//! frame.

use flate2::{Compress, Compression, FlushCompress};

use super::Opcode;

/// How to write one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec {
    /// What the frame carries.
    pub opcode: Opcode,
    /// The last frame of its message.
    pub fin: bool,
    /// RSV1, set on a compressed message's first frame.
    pub rsv1: bool,
    /// The masking key, for a client's frame.
    pub mask: Option<[u8; 4]>,
}

/// Appends one frame to `out`: its header, with the length in its shortest form, then the
/// payload, masked when the spec has a key.
pub fn write_frame(out: &mut Vec<u8>, spec: FrameSpec, payload: &[u8]) {
    let first = (u8::from(spec.fin) << 7) | (u8::from(spec.rsv1) << 6) | spec.opcode.bits();
    let masked = if spec.mask.is_some() { 0x80 } else { 0 };
    out.push(first);
    match payload.len() {
        len @ 0..=125 => out.push(masked | len as u8),
        len @ 126..=0xffff => {
            out.push(masked | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(masked | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    match spec.mask {
        None => out.extend_from_slice(payload),
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
    }
}

/// Compresses messages for `permessage-deflate` (RFC 7692 §7.2.1): raw DEFLATE flushed at the
/// message's end, the flush's final `00 00 ff ff` taken off.
pub struct Deflater {
    compressor: Compress,
    context_takeover: bool,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater")
            .field("context_takeover", &self.context_takeover)
            .finish()
    }
}

// === impl Deflater ===

impl Deflater {
    /// A compressor with a 32 KiB window that keeps it across messages, or starts each message
    /// afresh.
    pub fn new(context_takeover: bool) -> Self {
        Deflater {
            compressor: Compress::new(Compression::default(), false),
            context_takeover,
        }
    }

    /// One message's compressed payload.
    pub fn compress(&mut self, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(message.len() + 64);
        let start = self.compressor.total_in();
        // The input first, then the flush, each until it fits: zlib writes no flush marker for
        // a flush that follows a flush with nothing between.
        for flush in [FlushCompress::None, FlushCompress::Sync] {
            loop {
                let taken = (self.compressor.total_in() - start) as usize;
                // Given room, a compressor cannot fail.
                let _ = self
                    .compressor
                    .compress_vec(&message[taken..], &mut out, flush);
                let taken = (self.compressor.total_in() - start) as usize;
                if taken == message.len() && out.len() < out.capacity() {
                    break;
                }
                out.reserve(out.capacity());
            }
        }
        if out.ends_with(&[0x00, 0x00, 0xff, 0xff]) {
            out.truncate(out.len() - 4);
        }
        if !self.context_takeover {
            self.compressor.reset();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rfc_frames_are_written_byte_for_byte() {
        let text = FrameSpec {
            opcode: Opcode::Text,
            fin: true,
            rsv1: false,
            mask: None,
        };
        let mut out = Vec::new();
        write_frame(&mut out, text, b"Hello");
        assert_eq!(out, [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
        out.clear();
        let masked = FrameSpec {
            mask: Some([0x37, 0xfa, 0x21, 0x3d]),
            ..text
        };
        write_frame(&mut out, masked, b"Hello");
        assert_eq!(
            out,
            [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]
        );
        out.clear();
        write_frame(&mut out, text, &[0; 256]);
        assert_eq!(out[..4], [0x81, 0x7e, 0x01, 0x00]);
        out.clear();
        write_frame(&mut out, text, &[0; 65536]);
        assert_eq!(out[..10], [0x81, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn a_compressed_message_ends_without_the_flush_marker() {
        let mut deflater = Deflater::new(true);
        let first = deflater.compress(b"Hello");
        assert!(!first.ends_with(&[0x00, 0x00, 0xff, 0xff]));
        let second = deflater.compress(b"Hello");
        assert!(second.len() < first.len(), "the window is kept");
        let mut fresh = Deflater::new(false);
        assert_eq!(fresh.compress(b"Hello"), fresh.compress(b"Hello"));
    }
}
