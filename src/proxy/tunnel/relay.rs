//! The tunnel itself: one task joins the client's connection and the upstream's, byte for byte.
//!
//! Each direction reads into a buffer on the stack, hands the bytes to the metering, and writes
//! them on at once. Only what the receiving end has not taken is kept (on the heap, given back
//! once written), and that direction reads no more until it is out: an idle tunnel holds no
//! buffer at all, and a slow end holds back its sender through TCP, as it would without metronome.
//!
//! When either end goes away (its read ends or fails, or a write to it fails), the bytes it sent
//! that the other end has not taken yet are written, and the other end is closed at once. After
//! `timeouts.websocket_idle` without a byte either way, or when the drain grace is over,
//! metronome writes a `1001` close frame to each end that is between frames (masked toward the
//! upstream, as a client's frames must be), then closes both.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::ReadBuf;

use super::metering::{Setup, TunnelMeter};
use super::registry::{Outcome, StopSignal, TunnelMetrics};
use super::Io;
use crate::metering::clock::Tick;
use crate::metering::ledger::IngressEnd;
use crate::websocket::encode::{write_frame, FrameSpec};
use crate::websocket::{Direction, Opcode};

/// The stack buffer each read goes into.
const READ_BUF: usize = 16 * 1024;

/// Reads (or writes) one poll of a tunnel does before it lets other tasks run.
const BUDGET: usize = 32;

/// How long the closing of a tunnel may take to write what it still holds and its close frames.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// The close frame's status code: the endpoint is going away (RFC 6455 §7.4.1).
const GOING_AWAY: u16 = 1001;

/// Runs a tunnel between `client` and `upstream` until it ends, counted as open meanwhile.
pub async fn run(
    client: Box<dyn Io>,
    upstream: impl Io + 'static,
    setup: Setup,
    peer: &super::Peer,
) {
    let registered = peer.tunnels.register();
    // The client connection's place under `limits.max_connections`, held as long as the tunnel.
    let _place = peer.place.clone();
    let metrics = setup.state.tunnel_metrics.clone();
    let idle_timeout = setup.state.config.timeouts.websocket_idle;
    let mut counted = Counted::open(metrics, setup.route.clone());
    let tunnel = Tunnel {
        client,
        upstream: Box::new(upstream),
        up: Held::default(),
        down: Held::default(),
        meter: TunnelMeter::new(setup),
        idle: Box::pin(tokio::time::sleep(idle_timeout)),
        idle_timeout,
        last: Instant::now(),
        signal: registered.signal.clone(),
        closing: None,
    };
    counted.outcome = tunnel.await;
}

/// Counts a tunnel as open while it lives, and how it ended once it does (also when its task is
/// dropped with the runtime: then it was drained).
struct Counted {
    metrics: TunnelMetrics,
    route: Arc<str>,
    outcome: Outcome,
}

impl Counted {
    fn open(metrics: TunnelMetrics, route: Arc<str>) -> Self {
        metrics.active.with_label_values(&[&route]).inc();
        Counted {
            metrics,
            route,
            outcome: Outcome::Drained,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.metrics.active.with_label_values(&[&self.route]).dec();
        self.metrics.ended(&self.route, self.outcome);
    }
}

/// One direction's bytes that the receiving end has not taken yet.
#[derive(Debug, Default)]
struct Held {
    bytes: Vec<u8>,
    /// How many of `bytes` are written.
    at: usize,
    /// The last read was written and not yet flushed (and, toward the client, not yet stamped).
    flush: bool,
}

/// Which end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Upstream,
}

/// What one pass over a direction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Bytes moved: try again.
    Moved,
    /// Waiting for a socket.
    Blocked,
    /// That end went away.
    Gone(Side),
}

/// The closing of a tunnel: what is still to write, to whom, and by when.
struct Closing {
    outcome: Outcome,
    /// How the stream running at the close, if any, ended.
    end: IngressEnd,
    /// Still to write to (and then shut) the upstream.
    to_upstream: bool,
    /// Still to write to (and then shut) the client.
    to_client: bool,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

/// The two connections of one tunnel and what passes between them.
struct Tunnel {
    client: Box<dyn Io>,
    upstream: Box<dyn Io>,
    /// Client to upstream.
    up: Held,
    /// Upstream to client.
    down: Held,
    meter: TunnelMeter,
    /// Fires at the idle deadline; moved on lazily, only when it fires.
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_timeout: Duration,
    /// When the last byte was read, either way.
    last: Instant,
    signal: Arc<StopSignal>,
    closing: Option<Closing>,
}

impl Future for Tunnel {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = self.get_mut();
        if this.closing.is_none() {
            if this.signal.stopped(cx.waker()) {
                this.close_both(Outcome::Drained);
            } else if let Some(closing) = this.poll_open(cx) {
                this.closing = Some(closing);
            }
        }
        match this.closing.is_some() {
            true => this.poll_close(cx),
            false => Poll::Pending,
        }
    }
}

// === impl Tunnel ===

impl Tunnel {
    /// Moves bytes both ways until both wait; the closing, when an end went or the idle timeout
    /// fired.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Option<Closing> {
        for _ in 0..BUDGET {
            let up = pump(
                cx,
                [&mut self.client, &mut self.upstream],
                &mut self.up,
                &mut self.meter,
                Direction::ClientToServer,
                &mut self.last,
            );
            if let Step::Gone(side) = up {
                return Some(self.gone(side));
            }
            let down = pump(
                cx,
                [&mut self.upstream, &mut self.client],
                &mut self.down,
                &mut self.meter,
                Direction::ServerToClient,
                &mut self.last,
            );
            if let Step::Gone(side) = down {
                return Some(self.gone(side));
            }
            if up == Step::Blocked && down == Step::Blocked {
                return self.poll_idle(cx);
            }
        }
        cx.waker().wake_by_ref();
        None
    }

    /// The idle timer: moved on to the last read's deadline when it fires early, the closing
    /// once the tunnel was idle for the whole timeout.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Option<Closing> {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return None;
            }
            let due = self.last + self.idle_timeout;
            if due <= Instant::now() {
                self.close_both(Outcome::IdleTimeout);
                return self.closing.take();
            }
            self.idle.as_mut().reset(due.into());
        }
    }

    /// `side` went away: what it sent is delivered to the other end, which is then closed.
    fn gone(&mut self, side: Side) -> Closing {
        let outcome = match side {
            _ if self.meter.handshake_done() => Outcome::Completed,
            Side::Client => Outcome::ClientClosed,
            Side::Upstream => Outcome::UpstreamClosed,
        };
        let end = match side {
            Side::Client => IngressEnd::ClientGone,
            Side::Upstream => IngressEnd::UpstreamError,
        };
        Closing {
            outcome,
            end,
            to_upstream: side == Side::Client,
            to_client: side == Side::Upstream,
            deadline: Box::pin(tokio::time::sleep(CLOSE_WITHIN)),
        }
    }

    /// Metronome closes the tunnel (idle, drained): a `1001` close frame to each end that is
    /// between frames, after what it still holds, then both closed.
    fn close_both(&mut self, outcome: Outcome) {
        let reason = match outcome {
            Outcome::IdleTimeout => &b"idle"[..],
            _ => b"going away",
        };
        let mut payload = GOING_AWAY.to_be_bytes().to_vec();
        payload.extend_from_slice(reason);
        if self.meter.at_frame_boundary(Direction::ClientToServer) {
            let spec = FrameSpec {
                opcode: Opcode::Close,
                fin: true,
                rsv1: false,
                mask: Some(rand::random()),
            };
            write_frame(&mut self.up.bytes, spec, &payload);
        }
        if self.meter.at_frame_boundary(Direction::ServerToClient) {
            let spec = FrameSpec {
                opcode: Opcode::Close,
                fin: true,
                rsv1: false,
                mask: None,
            };
            write_frame(&mut self.down.bytes, spec, &payload);
        }
        self.closing = Some(Closing {
            outcome,
            end: IngressEnd::ClientGone,
            to_upstream: true,
            to_client: true,
            deadline: Box::pin(tokio::time::sleep(CLOSE_WITHIN)),
        });
    }

    /// Writes what is still to go and shuts the ends down, within [`CLOSE_WITHIN`].
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let Some(closing) = &mut self.closing else {
            return Poll::Pending;
        };
        if closing.to_upstream {
            let up = deliver(
                cx,
                &mut self.upstream,
                &mut self.up,
                &mut self.meter,
                Direction::ClientToServer,
            );
            closing.to_upstream = shut(cx, &mut self.upstream, up);
        }
        if closing.to_client {
            let down = deliver(
                cx,
                &mut self.client,
                &mut self.down,
                &mut self.meter,
                Direction::ServerToClient,
            );
            closing.to_client = shut(cx, &mut self.client, down);
        }
        let done = !closing.to_upstream && !closing.to_client;
        if done || closing.deadline.as_mut().poll(cx).is_ready() {
            self.meter.finish(closing.end);
            return Poll::Ready(closing.outcome);
        }
        Poll::Pending
    }
}

/// After a delivery's poll: shuts the end down once everything is written; whether there is
/// still something to do.
fn shut(cx: &mut Context<'_>, to: &mut Box<dyn Io>, delivered: Poll<io::Result<()>>) -> bool {
    match delivered {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => Pin::new(&mut **to).poll_shutdown(cx).is_pending(),
    }
}

/// One pass over one direction: writes what is held, then reads once and writes at once.
/// `ends` are the sender and the receiver.
fn pump(
    cx: &mut Context<'_>,
    ends: [&mut Box<dyn Io>; 2],
    held: &mut Held,
    meter: &mut TunnelMeter,
    direction: Direction,
    last: &mut Instant,
) -> Step {
    let (sender, receiver) = match direction {
        Direction::ClientToServer => (Side::Client, Side::Upstream),
        Direction::ServerToClient => (Side::Upstream, Side::Client),
    };
    let [from, to] = ends;
    match deliver(cx, to, held, meter, direction) {
        Poll::Pending => return Step::Blocked,
        Poll::Ready(Err(_)) => return Step::Gone(receiver),
        Poll::Ready(Ok(())) => {}
    }
    let mut buf = [0u8; READ_BUF];
    let mut read = ReadBuf::new(&mut buf);
    match Pin::new(&mut **from).poll_read(cx, &mut read) {
        Poll::Pending => return Step::Blocked,
        Poll::Ready(Err(_)) => return Step::Gone(sender),
        Poll::Ready(Ok(())) => {}
    }
    let bytes = read.filled();
    if bytes.is_empty() {
        return Step::Gone(sender);
    }
    let now = Instant::now();
    *last = now;
    let at = Tick::from_instant(now);
    match direction {
        Direction::ClientToServer => meter.from_client(bytes, at),
        Direction::ServerToClient => meter.from_upstream(bytes, at),
    }
    let mut written = 0;
    while written < bytes.len() {
        match Pin::new(&mut **to).poll_write(cx, &bytes[written..]) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Step::Gone(receiver),
            Poll::Ready(Ok(n)) => written += n,
            Poll::Pending => {
                held.bytes.extend_from_slice(&bytes[written..]);
                break;
            }
        }
    }
    held.flush = true;
    Step::Moved
}

/// Writes what `held` still has for `to`, then flushes; once a read's bytes are all out, the
/// metering hears that they reached the client.
fn deliver(
    cx: &mut Context<'_>,
    to: &mut Box<dyn Io>,
    held: &mut Held,
    meter: &mut TunnelMeter,
    direction: Direction,
) -> Poll<io::Result<()>> {
    while held.at < held.bytes.len() {
        match Pin::new(&mut **to).poll_write(cx, &held.bytes[held.at..]) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => held.at += n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
    }
    if !held.bytes.is_empty() {
        // Given back: an idle tunnel holds no buffer.
        *held = Held {
            flush: true,
            ..Held::default()
        };
    }
    if held.flush {
        std::task::ready!(Pin::new(&mut **to).poll_flush(cx))?;
        held.flush = false;
        if direction == Direction::ServerToClient {
            meter.delivered(Tick::now());
        }
    }
    Poll::Ready(Ok(()))
}
