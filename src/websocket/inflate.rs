//! `permessage-deflate` undone for reading (RFC 7692 §7.2.2): a message's payload is raw DEFLATE
//! data that ends where the sender flushed; with the 4 bytes `00 00 ff ff` appended it inflates
//! whole.
//!
//! One inflater serves one direction for the connection's life. With context takeover it keeps
//! DEFLATE's window from one message to the next, so every byte of every compressed message must
//! go through it, kept or not; without, it starts each message afresh. Its memory is fixed and
//! allocated at the direction's first compressed message: zlib-rs's state (about 10 KiB of
//! tables), a window of the sender's negotiated `max_window_bits` when it keeps its context (2^9
//! for a sender's 2^8, which zlib cannot be asked for and which reads every stream the smaller
//! window writes) and of 32 KiB when it does not (see [`Inflater::new`]), and a 4 KiB output
//! scratch. zlib-rs, not miniz_oxide: it decodes fixed-Huffman blocks from static
//! tables, where miniz_oxide builds its tables again for every block, that is for every small
//! message (most of a delta's cost), and it refuses a back-reference past the window.
//!
//! What it does past the message bound, decided by the cost of the alternative:
//! - without context takeover, it stops inflating the message: nothing later depends on the rest;
//! - with context takeover, it inflates the rest through the scratch and throws it away, up to
//!   [`Limits::max_inflated_bytes`] per message; past that it gives up on the direction
//!   ([`ReadError::InflateBudget`]), since skipping would leave every later message unreadable.

use flate2::{Decompress, FlushDecompress, Status};

use super::{Limits, ReadError};

/// What RFC 7692 §7.2.2 appends to every compressed message before inflating it: the end of the
/// empty stored block the sender's flush wrote and took off again.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The output scratch each inflating step writes into, before the message's bound is applied.
const SCRATCH_LEN: usize = 4096;

/// The smallest window zlib inflates with (`max_window_bits` may negotiate 8).
const MIN_WINDOW_BITS: u8 = 9;

/// One direction's inflater and the state of the compressed message it is inside.
pub(super) struct Inflater {
    /// zlib-rs's stream and the output scratch, allocated at the first compressed message.
    state: Option<Box<InflateState>>,
    /// The sender's negotiated window.
    window_bits: u8,
    /// The sender keeps its window across messages.
    context_takeover: bool,
    /// Bytes the current message inflated to, kept or thrown away.
    inflated: u64,
    /// The current message inflated past the bound.
    oversize: bool,
    /// The current message's DEFLATE stream ended (a block with BFINAL): the rest of its bytes,
    /// and the tail, are ignored, and the next message starts a new stream.
    ended: bool,
}

/// What an inflater allocates once.
struct InflateState {
    stream: Decompress,
    scratch: [u8; SCRATCH_LEN],
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("allocated", &self.state.is_some())
            .field("window_bits", &self.window_bits)
            .field("context_takeover", &self.context_takeover)
            .field("inflated", &self.inflated)
            .field("oversize", &self.oversize)
            .field("ended", &self.ended)
            .finish()
    }
}

// === impl Inflater ===

impl Inflater {
    /// An inflater for a direction whose sender compresses with a window of `2^window_bits`
    /// bytes and keeps its context or not.
    pub(super) fn new(window_bits: u8, context_takeover: bool) -> Self {
        // Without context takeover the stream is reset after every message, which flate2 does
        // in place only for a 32 KiB window (it builds a new state for any other): the full
        // window then, rather than an allocation per message.
        let window_bits = if context_takeover { window_bits } else { 15 };
        Inflater {
            state: None,
            window_bits: window_bits.clamp(MIN_WINDOW_BITS, 15),
            context_takeover,
            inflated: 0,
            oversize: false,
            ended: false,
        }
    }

    /// Nothing more of the current message is inflated: its stream ended, or it is oversize
    /// and nothing later depends on its rest.
    pub(super) fn is_skipping(&self) -> bool {
        self.ended || (self.oversize && !self.context_takeover)
    }

    /// Inflates the next (unmasked) piece of the current message's payload, keeping its output
    /// in `out` up to `limits.max_message_bytes`.
    pub(super) fn feed(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        limits: &Limits,
    ) -> Result<(), ReadError> {
        if self.is_skipping() {
            return Ok(());
        }
        let window_bits = self.window_bits;
        let state = self.state.get_or_insert_with(|| {
            Box::new(InflateState {
                stream: Decompress::new_with_window_bits(false, window_bits),
                scratch: [0; SCRATCH_LEN],
            })
        });
        let mut input = input;
        loop {
            let (before_in, before_out) = (state.stream.total_in(), state.stream.total_out());
            let status = state
                .stream
                .decompress(input, &mut state.scratch, FlushDecompress::None);
            let consumed = (state.stream.total_in() - before_in) as usize;
            let written = (state.stream.total_out() - before_out) as usize;
            input = &input[consumed..];
            // What came out before an error counts first, so the outcome does not depend on
            // where the reads cut the message: an error past the bound is never reached by a
            // reading that skips or gives up there, however the bytes arrive.
            let keep = written.min(limits.max_message_bytes.saturating_sub(out.len()));
            out.extend_from_slice(&state.scratch[..keep]);
            self.oversize |= keep < written;
            self.inflated += written as u64;
            if self.context_takeover && self.inflated > limits.max_inflated_bytes {
                return Err(ReadError::InflateBudget {
                    limit: limits.max_inflated_bytes,
                });
            }
            if self.oversize && !self.context_takeover {
                return Ok(());
            }
            if status.map_err(|_| ReadError::InvalidDeflate)? == Status::StreamEnd {
                self.ended = true;
                return Ok(());
            }
            // Done when the input is all taken and the scratch was not filled (a filled one may
            // leave more pending), or when a step moved nothing.
            let stalled = consumed == 0 && written == 0;
            if stalled || (input.is_empty() && written < SCRATCH_LEN) {
                return Ok(());
            }
        }
    }

    /// The current message's last byte was fed: inflates the tail, readies the inflater for the
    /// next message, and says whether this one was oversize.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>, limits: &Limits) -> Result<bool, ReadError> {
        let fed = self.feed(&TAIL, out, limits);
        let oversize = self.oversize;
        let fresh = !self.context_takeover || self.ended;
        self.inflated = 0;
        self.oversize = false;
        self.ended = false;
        if fresh {
            if let Some(state) = self.state.as_mut() {
                // inflateReset: the window is forgotten (a reference into it is an error) but
                // kept allocated.
                state.stream.reset(false);
            }
        }
        fed.map(|()| oversize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max_message_bytes: max,
            max_inflated_bytes: 1 << 20,
        }
    }

    fn message(inflater: &mut Inflater, payload: &[u8], max: usize) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        inflater.feed(payload, &mut out, &limits(max)).unwrap();
        let oversize = inflater.finish(&mut out, &limits(max)).unwrap();
        (out, oversize)
    }

    const HELLO: [u8; 7] = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];

    #[test]
    fn the_rfc_examples_inflate_to_hello() {
        // RFC 7692 §7.2.3.1 (one compressed block), §7.2.3.3 (a stored block), §7.2.3.4
        // (BFINAL set), §7.2.3.5 (two blocks).
        for payload in [
            &HELLO[..],
            &[
                0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
            ],
            &[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00],
            &[
                0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00,
            ],
        ] {
            let mut inflater = Inflater::new(15, true);
            assert_eq!(
                message(&mut inflater, payload, 100),
                (b"Hello".to_vec(), false)
            );
            // And the next message still reads after it.
            assert_eq!(
                message(&mut inflater, &HELLO, 100),
                (b"Hello".to_vec(), false)
            );
        }
    }

    #[test]
    fn context_takeover_reads_a_message_that_refers_to_the_one_before() {
        // RFC 7692 §7.2.3.2: the second "Hello" is a back-reference into the first.
        let mut inflater = Inflater::new(15, true);
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        let second = [0xf2, 0x00, 0x11, 0x00, 0x00];
        assert_eq!(message(&mut inflater, &second, 100).0, b"Hello");
    }

    #[test]
    fn without_context_takeover_each_message_starts_afresh() {
        let mut inflater = Inflater::new(15, false);
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        // The back-reference of §7.2.3.2 has nothing to refer to any more.
        let second = [0xf2, 0x00, 0x11, 0x00, 0x00];
        let mut out = Vec::new();
        let read = inflater
            .feed(&second, &mut out, &limits(100))
            .and_then(|()| inflater.finish(&mut out, &limits(100)));
        assert_eq!(read, Err(ReadError::InvalidDeflate));
    }

    #[test]
    fn a_message_fed_byte_by_byte_inflates_the_same() {
        let mut inflater = Inflater::new(15, true);
        let mut out = Vec::new();
        for b in HELLO {
            inflater.feed(&[b], &mut out, &limits(100)).unwrap();
        }
        assert!(!inflater.finish(&mut out, &limits(100)).unwrap());
        assert_eq!(out, b"Hello");
    }

    #[test]
    fn past_the_bound_the_beginning_is_kept_and_the_context_still_follows() {
        let mut inflater = Inflater::new(15, true);
        assert_eq!(message(&mut inflater, &HELLO, 3), (b"Hel".to_vec(), true));
        assert_eq!(
            message(&mut inflater, &HELLO, 5),
            (b"Hello".to_vec(), false)
        );
        let second = [0xf2, 0x00, 0x11, 0x00, 0x00];
        assert_eq!(message(&mut inflater, &second, 100).0, b"Hello");
    }

    #[test]
    fn with_context_takeover_a_message_past_the_budget_stops_the_reading() {
        let mut inflater = Inflater::new(15, true);
        let mut out = Vec::new();
        let tight = Limits {
            max_message_bytes: 2,
            max_inflated_bytes: 4,
        };
        let read = inflater
            .feed(&HELLO, &mut out, &tight)
            .and_then(|()| inflater.finish(&mut out, &tight));
        assert_eq!(read, Err(ReadError::InflateBudget { limit: 4 }));
    }

    #[test]
    fn data_that_is_not_deflate_is_an_error() {
        let mut inflater = Inflater::new(15, true);
        let mut out = Vec::new();
        // BTYPE 11 is reserved.
        let fed = inflater.feed(&[0xff, 0xff], &mut out, &limits(100));
        assert_eq!(fed, Err(ReadError::InvalidDeflate));
    }
}
