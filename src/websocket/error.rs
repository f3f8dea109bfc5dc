//! Why a reader stopped reading a direction.

/// A frame the reader cannot follow, or a message that would cost too much to read. Each is
/// final for the direction: an endpoint fails the connection on the protocol errors (RFC 6455
/// §7.1.7), so nothing after one is worth reading, while the tunnel forwards the bytes anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// RSV2 or RSV3, or RSV1 without `permessage-deflate`, or RSV1 on a control frame or on a
    /// message's later fragment (RFC 6455 §5.2, RFC 7692 §6.1).
    #[error("reserved bits {0:#05b} set where no negotiated extension defines them")]
    ReservedBits(u8),
    /// An opcode RFC 6455 reserves (0x3 to 0x7, 0xB to 0xF).
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    /// A control frame without FIN (control frames are never fragmented, §5.5).
    #[error("a fragmented control frame")]
    FragmentedControl,
    /// A control frame whose payload is over 125 bytes (§5.5).
    #[error("a control frame of {0} bytes (at most 125)")]
    ControlTooLong(u64),
    /// A payload length not in its shortest form (§5.2: "the minimal number of bytes MUST be
    /// used to encode the length").
    #[error("a payload length not written in its shortest form")]
    NonMinimalLength,
    /// A 64-bit payload length with its most significant bit set (§5.2).
    #[error("a 64-bit payload length with its most significant bit set")]
    LengthTooLarge,
    /// A client frame without a masking key (§5.1).
    #[error("a client frame that is not masked")]
    UnmaskedClientFrame,
    /// A server frame with a masking key (§5.1).
    #[error("a server frame that is masked")]
    MaskedServerFrame,
    /// A continuation frame with no fragmented message to continue (§5.4).
    #[error("a continuation frame with no message to continue")]
    UnexpectedContinuation,
    /// A text or binary frame while a fragmented message was still open (§5.4).
    #[error("a new message began before the fragmented one ended")]
    MessageInterrupted,
    /// A close frame with a 1-byte payload (a status code takes two, §5.5.1).
    #[error("a close frame with a 1-byte payload")]
    CloseTooShort,
    /// A close status code no endpoint may send (§7.4.1, and the IANA registry: 1000 to 1003,
    /// 1007 to 1014 and 3000 to 4999 may be).
    #[error("close status code {0}, which no endpoint may send")]
    InvalidCloseCode(u16),
    /// A close reason that is not UTF-8 (§5.5.1).
    #[error("a close reason that is not UTF-8")]
    CloseReasonNotUtf8,
    /// Bytes after a close frame (§5.5.1: nothing follows it).
    #[error("bytes after the close frame")]
    DataAfterClose,
    /// A compressed message that is not valid DEFLATE data (RFC 7692 §7.2.2).
    #[error("a compressed message that is not valid DEFLATE data")]
    InvalidDeflate,
    /// A compressed message that inflated past the bound while its sender keeps the context, so
    /// reading it whole (needed to read the next one) would cost too much.
    #[error("a compressed message inflated past {limit} bytes with context takeover")]
    InflateBudget {
        /// The bound ([`super::Limits::max_inflated_bytes`]).
        limit: u64,
    },
}
