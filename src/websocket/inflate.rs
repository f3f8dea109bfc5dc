//! `permessage-deflate` undone for reading (RFC 7692 §7.2.2): a message's payload is raw DEFLATE
//! data that ends where the sender flushed; with the 4 bytes `00 00 ff ff` appended it inflates
//! whole.
//!
//! One inflater serves one direction for the connection's life. With context takeover it keeps
//! DEFLATE's window from one message to the next, so every byte of every compressed message must
//! go through it, kept or not; without, it starts each message afresh. Its memory is fixed:
//! miniz_oxide's state (its 32 KiB window, the largest any `max_window_bits` allows, and its
//! Huffman tables), allocated at the direction's first compressed message.
//!
//! What it does past the message bound, decided by the cost of the alternative:
//! - without context takeover, it stops inflating the message: nothing later depends on the rest;
//! - with context takeover, it inflates the rest into a scratch it throws away, up to
//!   [`Limits::max_inflated_bytes`] per message; past that it gives up on the direction
//!   ([`ReadError::InflateBudget`]), since skipping would leave every later message unreadable.

use miniz_oxide::inflate::stream::{inflate, InflateState, MinReset};
use miniz_oxide::{DataFormat, MZError, MZFlush, MZStatus};

use super::{Limits, ReadError};

/// What RFC 7692 §7.2.2 appends to every compressed message before inflating it: the end of the
/// empty stored block the sender's flush wrote and took off again.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Output room asked for beyond four times the input, so a small message inflates in one call.
const MIN_OUTPUT_STEP: usize = 256;

/// The scratch that takes what a message inflates to past its bound.
const DISCARD_LEN: usize = 1024;

/// One direction's inflater and the state of the compressed message it is inside.
pub(super) struct Inflater {
    /// miniz_oxide's streaming state, allocated at the first compressed message.
    state: Option<Box<InflateState>>,
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

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("allocated", &self.state.is_some())
            .field("context_takeover", &self.context_takeover)
            .field("inflated", &self.inflated)
            .field("oversize", &self.oversize)
            .field("ended", &self.ended)
            .finish()
    }
}

// === impl Inflater ===

impl Inflater {
    /// An inflater for a direction whose sender keeps its context or not.
    pub(super) fn new(context_takeover: bool) -> Self {
        Inflater {
            state: None,
            context_takeover,
            inflated: 0,
            oversize: false,
            ended: false,
        }
    }

    /// Inflates the next (unmasked) piece of the current message's payload into `out`, up to
    /// `limits.max_message_bytes`.
    pub(super) fn feed(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        limits: &Limits,
    ) -> Result<(), ReadError> {
        if self.is_skipping() {
            return Ok(());
        }
        let state = self
            .state
            .get_or_insert_with(|| InflateState::new_boxed(DataFormat::Raw));
        let mut input = input;
        let mut discard = None;
        loop {
            let room = limits.max_message_bytes.saturating_sub(out.len());
            let kept = out.len();
            let result = if room > 0 {
                let step = room.min(input.len().saturating_mul(4).max(MIN_OUTPUT_STEP));
                out.resize(kept + step, 0);
                let result = inflate(state, input, &mut out[kept..], MZFlush::None);
                out.truncate(kept + result.bytes_written);
                (result, step)
            } else {
                let scratch = discard.get_or_insert([0u8; DISCARD_LEN]);
                let result = inflate(state, input, scratch, MZFlush::None);
                if result.bytes_written > 0 {
                    self.oversize = true;
                }
                (result, DISCARD_LEN)
            };
            let (result, offered) = result;
            input = &input[result.bytes_consumed..];
            self.inflated += result.bytes_written as u64;
            if self.context_takeover && self.inflated > limits.max_inflated_bytes {
                return Err(ReadError::InflateBudget {
                    limit: limits.max_inflated_bytes,
                });
            }
            match result.status {
                Ok(MZStatus::StreamEnd) => {
                    self.ended = true;
                    return Ok(());
                }
                // `Buf` is "no progress possible now": more input is needed, or output room
                // for what is pending, which the next turn gives.
                Ok(_) | Err(MZError::Buf) => {}
                Err(_) => return Err(ReadError::InvalidDeflate),
            }
            if self.oversize && !self.context_takeover {
                return Ok(());
            }
            // Done when the input is all taken and the output was not filled (a filled one may
            // leave more pending), or when a turn moved nothing.
            let stalled = result.bytes_written == 0 && result.bytes_consumed == 0;
            if stalled || (input.is_empty() && result.bytes_written < offered) {
                return Ok(());
            }
        }
    }

    /// Nothing more of the current message is inflated: its stream ended, or it is oversize
    /// and nothing later depends on its rest.
    pub(super) fn is_skipping(&self) -> bool {
        self.ended || (self.oversize && !self.context_takeover)
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
                // The window is not zeroed: it holds only this direction's earlier messages.
                state.reset_as(MinReset);
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
            let mut inflater = Inflater::new(true);
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
        let mut inflater = Inflater::new(true);
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        let second = [0xf2, 0x00, 0x11, 0x00, 0x00];
        assert_eq!(message(&mut inflater, &second, 100).0, b"Hello");
    }

    #[test]
    fn without_context_takeover_each_message_starts_afresh() {
        let mut inflater = Inflater::new(false);
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        assert_eq!(message(&mut inflater, &HELLO, 100).0, b"Hello");
        // The back-reference of §7.2.3.2 has nothing to refer to any more.
        let second = [0xf2, 0x00, 0x11, 0x00, 0x00];
        assert_ne!(message(&mut inflater, &second, 100).0, b"Hello");
    }

    #[test]
    fn a_message_fed_byte_by_byte_inflates_the_same() {
        let mut inflater = Inflater::new(true);
        let mut out = Vec::new();
        for b in HELLO {
            inflater.feed(&[b], &mut out, &limits(100)).unwrap();
        }
        assert!(!inflater.finish(&mut out, &limits(100)).unwrap());
        assert_eq!(out, b"Hello");
    }

    #[test]
    fn past_the_bound_the_beginning_is_kept_and_the_context_still_follows() {
        let mut inflater = Inflater::new(true);
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
        let mut inflater = Inflater::new(true);
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
        let mut inflater = Inflater::new(true);
        let mut out = Vec::new();
        // BTYPE 11 is reserved.
        let fed = inflater.feed(&[0xff, 0xff], &mut out, &limits(100));
        assert_eq!(fed, Err(ReadError::InvalidDeflate));
    }
}
