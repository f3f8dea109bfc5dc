//! The frame header of RFC 6455 §5.2, read from a slice and checked against what the connection
//! negotiated; and the partial header a reader carries when a read ends inside one.

use super::{Direction, ReadError};

/// The most bytes a frame header takes: 2, then 8 of extended payload length, then 4 of masking
/// key.
pub const MAX_HEADER_LEN: usize = 14;

/// The largest control frame payload (RFC 6455 §5.5).
pub(super) const MAX_CONTROL_PAYLOAD: usize = 125;

/// A frame's opcode; the reserved ones are refused when the header is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// 0x0: a later fragment of a message.
    Continuation,
    /// 0x1: the first frame of a text message.
    Text,
    /// 0x2: the first frame of a binary message.
    Binary,
    /// 0x8: the closing handshake.
    Close,
    /// 0x9: a ping.
    Ping,
    /// 0xA: a pong.
    Pong,
}

// === impl Opcode ===

impl Opcode {
    /// The opcode of the low four bits, `None` for a reserved one.
    fn from_bits(bits: u8) -> Option<Opcode> {
        Some(match bits {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    /// The four bits on the wire.
    pub fn bits(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    /// Close, ping and pong: never fragmented, at most 125 bytes, allowed between fragments.
    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// A frame header as read from the wire, already checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The last frame of its message (always set on control frames).
    pub fin: bool,
    /// RSV1: with `permessage-deflate`, set on a compressed message's first frame.
    pub rsv1: bool,
    /// What the frame carries.
    pub opcode: Opcode,
    /// The client's masking key; `None` on server frames.
    pub mask: Option<[u8; 4]>,
    /// The payload's length.
    pub payload_len: u64,
    /// The header's own length, 2 to 14 bytes.
    pub header_len: u8,
}

/// The header's length from its second byte (mask bit and 7-bit length).
pub(super) fn header_len(second: u8) -> usize {
    let extended = match second & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let key = if second & 0x80 != 0 { 4 } else { 0 };
    2 + extended + key
}

/// Reads the header at the start of `bytes`, which holds at least [`header_len`] of its second
/// byte, and checks what one header can break: reserved bits and opcodes, control frame rules,
/// the length's form, and the mask against the direction. `deflate` says whether RSV1 may be set.
pub(super) fn parse(
    bytes: &[u8],
    direction: Direction,
    deflate: bool,
) -> Result<FrameHeader, ReadError> {
    let (first, second) = (bytes[0], bytes[1]);
    let fin = first & 0x80 != 0;
    let rsv = (first >> 4) & 0x7;
    let opcode = Opcode::from_bits(first & 0x0f).ok_or(ReadError::ReservedOpcode(first & 0x0f))?;
    let rsv1_allowed = deflate && matches!(opcode, Opcode::Text | Opcode::Binary);
    if rsv & 0b011 != 0 || (rsv & 0b100 != 0 && !rsv1_allowed) {
        return Err(ReadError::ReservedBits(rsv));
    }
    let (payload_len, mut at) = match second & 0x7f {
        126 => {
            let len = u64::from(u16::from_be_bytes([bytes[2], bytes[3]]));
            if len < 126 {
                return Err(ReadError::NonMinimalLength);
            }
            (len, 4)
        }
        127 => {
            let mut be = [0; 8];
            be.copy_from_slice(&bytes[2..10]);
            let len = u64::from_be_bytes(be);
            if len >> 63 != 0 {
                return Err(ReadError::LengthTooLarge);
            }
            if len <= u64::from(u16::MAX) {
                return Err(ReadError::NonMinimalLength);
            }
            (len, 10)
        }
        short => (u64::from(short), 2),
    };
    if opcode.is_control() {
        if !fin {
            return Err(ReadError::FragmentedControl);
        }
        if payload_len > MAX_CONTROL_PAYLOAD as u64 {
            return Err(ReadError::ControlTooLong(payload_len));
        }
    }
    let mask = if second & 0x80 != 0 {
        let key = [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        at += 4;
        Some(key)
    } else {
        None
    };
    match (direction, mask) {
        (Direction::ClientToServer, None) => return Err(ReadError::UnmaskedClientFrame),
        (Direction::ServerToClient, Some(_)) => return Err(ReadError::MaskedServerFrame),
        _ => {}
    }
    Ok(FrameHeader {
        fin,
        rsv1: rsv & 0b100 != 0,
        opcode,
        mask,
        payload_len,
        header_len: at as u8,
    })
}

/// The first bytes of a header that a read cut short, kept until the rest arrives.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PartialHeader {
    bytes: [u8; MAX_HEADER_LEN],
    len: u8,
}

// === impl PartialHeader ===

impl PartialHeader {
    /// Nothing of a header is kept.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole header's length, once its first two bytes are here.
    fn needed(&self) -> usize {
        if self.len < 2 {
            2
        } else {
            header_len(self.bytes[1])
        }
    }

    /// Takes from `bytes` what the header still lacks; returns how many bytes it took.
    pub(super) fn fill(&mut self, bytes: &[u8]) -> usize {
        let mut taken = 0;
        loop {
            let have = usize::from(self.len);
            let want = self.needed() - have;
            let n = want.min(bytes.len() - taken);
            self.bytes[have..have + n].copy_from_slice(&bytes[taken..taken + n]);
            self.len += n as u8;
            taken += n;
            // A header's length is known from its second byte: one more turn takes the rest.
            if n == 0 || self.is_complete() {
                return taken;
            }
        }
    }

    /// The whole header is here.
    pub(super) fn is_complete(&self) -> bool {
        usize::from(self.len) >= 2 && usize::from(self.len) == self.needed()
    }

    /// The kept header bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Forgets the kept bytes, for the next header.
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(bytes: &[u8]) -> Result<FrameHeader, ReadError> {
        parse(bytes, Direction::ServerToClient, false)
    }

    #[test]
    fn an_unmasked_text_frame_header_is_two_bytes() {
        let h = server(&[0x81, 0x05]).unwrap();
        assert_eq!(
            (h.fin, h.opcode, h.payload_len, h.header_len, h.mask),
            (true, Opcode::Text, 5, 2, None)
        );
    }

    #[test]
    fn a_masked_header_carries_its_key_after_the_length() {
        let h = parse(
            &[0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d],
            Direction::ClientToServer,
            false,
        )
        .unwrap();
        assert_eq!(h.mask, Some([0x37, 0xfa, 0x21, 0x3d]));
        assert_eq!(h.header_len, 6);
        assert_eq!(header_len(0x85), 6);
    }

    #[test]
    fn lengths_of_16_and_64_bits_are_read_big_endian() {
        assert_eq!(server(&[0x82, 0x7e, 0x01, 0x00]).unwrap().payload_len, 256);
        let h = server(&[0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0]).unwrap();
        assert_eq!((h.payload_len, h.header_len), (65536, 10));
    }

    #[test]
    fn a_length_not_in_its_shortest_form_is_refused() {
        assert_eq!(
            server(&[0x82, 0x7e, 0x00, 0x7d]),
            Err(ReadError::NonMinimalLength)
        );
        assert_eq!(
            server(&[0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
            Err(ReadError::NonMinimalLength)
        );
        assert_eq!(
            server(&[0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0]),
            Err(ReadError::LengthTooLarge)
        );
    }

    #[test]
    fn reserved_opcodes_and_bits_are_refused() {
        assert_eq!(server(&[0x83, 0x00]), Err(ReadError::ReservedOpcode(3)));
        assert_eq!(server(&[0x8b, 0x00]), Err(ReadError::ReservedOpcode(0xb)));
        assert_eq!(server(&[0xc1, 0x00]), Err(ReadError::ReservedBits(0b100)));
        assert_eq!(server(&[0xa1, 0x00]), Err(ReadError::ReservedBits(0b010)));
        let deflate = |b: &[u8]| parse(b, Direction::ServerToClient, true);
        assert!(deflate(&[0xc1, 0x00]).unwrap().rsv1);
        assert_eq!(deflate(&[0xc9, 0x00]), Err(ReadError::ReservedBits(0b100)));
        assert_eq!(deflate(&[0xc0, 0x00]), Err(ReadError::ReservedBits(0b100)));
        assert_eq!(deflate(&[0x91, 0x00]), Err(ReadError::ReservedBits(0b001)));
    }

    #[test]
    fn control_frames_are_short_and_whole() {
        assert_eq!(server(&[0x09, 0x00]), Err(ReadError::FragmentedControl));
        assert_eq!(
            server(&[0x89, 0x7e, 0x00, 0x7e]),
            Err(ReadError::ControlTooLong(126))
        );
        assert_eq!(server(&[0x89, 0x7d]).unwrap().payload_len, 125);
    }

    #[test]
    fn the_mask_must_match_the_direction() {
        assert_eq!(
            parse(&[0x81, 0x00], Direction::ClientToServer, false),
            Err(ReadError::UnmaskedClientFrame)
        );
        assert_eq!(
            server(&[0x81, 0x80, 1, 2, 3, 4]),
            Err(ReadError::MaskedServerFrame)
        );
    }

    #[test]
    fn a_partial_header_is_filled_across_reads() {
        let header = [0x82, 0xff, 0, 0, 0, 0, 0, 1, 0, 0, 9, 8, 7, 6];
        for cut in 1..header.len() {
            let mut partial = PartialHeader::default();
            assert_eq!(partial.fill(&header[..cut]), cut);
            assert!(!partial.is_complete());
            assert_eq!(partial.fill(&header[cut..]), header.len() - cut);
            assert!(partial.is_complete());
            assert_eq!(partial.bytes(), &header);
        }
        let mut partial = PartialHeader::default();
        assert_eq!(
            partial.fill(&[0x81, 0x05, b'H', b'e']),
            2,
            "takes no payload"
        );
        assert!(partial.is_complete());
    }
}
