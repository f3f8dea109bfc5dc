//! HTTP/1.1 as it is on the wire (RFC 9112), for both of metronome's roles: the server that
//! reads client requests (`proxy::h1`) and the client that reads upstream responses
//! (`proxy::upstream::native`).
//!
//! What the two roles share lives here once, as hyper keeps it in `proto::h1` (decode, encode,
//! role) and pingora in `protocols::http::v1` (common, body): the header-field limit, httparse's
//! head turned into `http` types ([`head`]), the `content-length` reader, the chunk-size line
//! encoder ([`encode`]) and the message body decoder ([`decode`]). What differs by role (which
//! body lengths are refused, keep-alive, the response's framing, the request line) stays with
//! the role.
//!
//! This is a wire-format layer: it depends on std, `http`, `httparse`, `bytes` and small leaf
//! crates only, never on `crate::proxy`.

pub mod decode;
pub mod encode;
pub mod head;

/// The most header fields a request or response head may have (as hyper): httparse is given an
/// array of this many on the stack.
pub const MAX_HEADERS: usize = 100;
