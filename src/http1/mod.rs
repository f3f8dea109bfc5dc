//! HTTP/1.1 as it is on the wire (RFC 9112), and metronome's two roles that speak it: the
//! server that reads client requests ([`server`]) and the client that sends them upstream and
//! reads the responses ([`client`]).
//!
//! What the two roles share lives here once, as hyper keeps it in `proto::h1` (decode, encode,
//! role) and pingora in `protocols::http::v1` (common, body): the header-field limit, httparse's
//! head turned into `http` types ([`head`]), the `content-length` reader, the chunk-size line
//! encoder ([`encode`]) and the message body decoder ([`decode`]). What differs by role (which
//! body lengths are refused, keep-alive, the response's framing, the request line) stays with
//! the role, and the roles do not name each other.
//!
//! The roles are generic over the bodies they carry: the server hands each request to a service
//! with its own [`server::request_body::Http1RequestBody`] and writes whatever `Body` the
//! service answers with; the client sends any `Body` and hands back its own response body. So
//! this layer depends on std, `http`, `httparse`, `bytes`, tokio and small leaf crates only,
//! never on `crate::proxy` or any other module of the crate (tests/it/layers.rs checks it).

pub mod client;
pub mod decode;
pub mod encode;
pub mod head;
pub mod request_form;
pub mod server;
pub mod watched;

use std::task::{Context, Waker};

/// The most header fields a request or response head may have (as hyper): httparse is given an
/// array of this many on the stack.
pub const MAX_HEADERS: usize = 100;

/// The error type of bodies: anything that aborts a request or a response.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Keeps `cx`'s waker in `slot`, cloning only when it changed.
pub fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}
