//! One WebSocket's life in the sim: client messages in, responses out, one response at a time.
//!
//! The session waits on three things at once: the client's next frame, the running response's
//! next frame (a [`SimStream`], on its cadence), and its timers (pings, the end of a closing
//! handshake). A response's frames become messages ([`Framer`]); when it ends, the next waiting
//! `response.create` starts. When the client closes the socket (or it breaks), the running
//! response is dropped at once, so generation stops and the counters say `cancelled`.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::time::{Instant, Interval};
use yawc::close::CloseCode;
use yawc::{Frame, HttpWebSocket, OpCode};

use super::messages::Framer;
use super::realtime::RealtimeSession;
use super::responses;
use crate::sim::request::GenRequest;
use crate::sim::routes::websocket_stream;
use crate::sim::server::SimShared;
use crate::sim::shapes::{Api, RealtimeStyle};
use crate::sim::stream::SimStream;

/// How long a closing handshake the server began may wait for the client's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The close code of a socket closed because the sim shuts down (RFC 6455 "going away").
const GOING_AWAY: u16 = 1001;

/// What a client message asks of the session.
#[derive(Debug)]
pub(super) enum Ask {
    /// Start a response, written in `RealtimeStyle` (the default for the Responses API).
    Create(GenRequest, RealtimeStyle),
    /// Cancel the running response (the Realtime API's `response.cancel`).
    Cancel,
}

/// Which API the socket speaks.
#[derive(Debug)]
pub(super) enum Protocol {
    /// The Responses API's WebSocket mode.
    Responses,
    /// The Realtime API, with its session's state.
    Realtime(RealtimeSession),
}

/// A response being streamed.
struct Running {
    stream: Box<SimStream>,
    framer: Framer,
}

/// Whether the session goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Continue,
    End,
}

/// One socket's state.
struct Session {
    ws: HttpWebSocket,
    shared: Arc<SimShared>,
    protocol: Protocol,
    running: Option<Running>,
    /// `response.create`s waiting behind the running response (Responses API only).
    queue: VecDeque<GenRequest>,
    /// Responses this socket completed.
    served: u64,
    /// Text messages to send, in order.
    out: Vec<Bytes>,
    /// A control frame to send after them (a ping, the server's close).
    control: Option<Frame>,
    /// When the server's close frame went out: the client's answer is awaited until then plus
    /// [`CLOSE_WAIT`].
    closing: Option<Instant>,
    /// The sim shuts down: the socket closes once its running response is complete.
    draining: bool,
}

/// Serves one upgraded socket until either side closes it.
pub(super) async fn serve(ws: HttpWebSocket, shared: Arc<SimShared>, mut protocol: Protocol) {
    let mut out = Vec::new();
    if let Protocol::Realtime(session) = &mut protocol {
        session.greeting(&mut out);
    }
    let mut shutdown = shared.closing.clone();
    let mut ping = shared.config.websocket.ping.map(|every| {
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let mut s = Session {
        ws,
        shared,
        protocol,
        running: None,
        queue: VecDeque::new(),
        served: 0,
        out,
        control: None,
        closing: None,
        draining: false,
    };
    if *shutdown.borrow() {
        s.begin_close(GOING_AWAY, "the sim is shutting down");
    }
    loop {
        if s.send().await.is_err() {
            break;
        }
        let close_by = s.closing.map(|at| at + CLOSE_WAIT);
        let next = tokio::select! {
            frame = s.ws.next() => s.on_frame(frame),
            frame = next_frame(&mut s.running) => s.on_response_frame(frame),
            () = tick(&mut ping) => {
                s.control.get_or_insert_with(|| Frame::ping(Bytes::from_static(b"sim")));
                Next::Continue
            }
            changed = shutdown.changed(), if !s.draining => {
                if changed.is_err() || *shutdown.borrow() {
                    s.drain();
                }
                Next::Continue
            }
            () = sleep_until(close_by), if close_by.is_some() => Next::End,
        };
        if next == Next::End {
            break;
        }
    }
    // Dropping the session drops a running response: its guard counts it cancelled.
}

/// The running response's next frame; never, when none runs.
async fn next_frame(running: &mut Option<Running>) -> Option<Bytes> {
    match running {
        Some(running) => poll_fn(|cx| running.stream.poll_next_frame(cx)).await,
        None => std::future::pending().await,
    }
}

/// The next ping time; never, without pings.
async fn tick(ping: &mut Option<Interval>) {
    match ping {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `at` (never for `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

// === impl Session ===

impl Session {
    /// The API the socket speaks.
    fn api(&self) -> Api {
        match self.protocol {
            Protocol::Responses => Api::Responses,
            Protocol::Realtime(_) => Api::Realtime,
        }
    }

    /// Sends what is waiting: the text messages, then the control frame, in one flush.
    async fn send(&mut self) -> Result<(), yawc::WebSocketError> {
        if self.out.is_empty() && self.control.is_none() {
            return Ok(());
        }
        for message in self.out.drain(..) {
            self.ws.feed(Frame::text(message)).await?;
        }
        if let Some(control) = self.control.take() {
            self.ws.feed(control).await?;
        }
        self.ws.flush().await
    }

    /// A frame from the client (`None`: the socket is closed or broken).
    fn on_frame(&mut self, frame: Option<Frame>) -> Next {
        let Some(frame) = frame else {
            return Next::End;
        };
        match frame.opcode() {
            OpCode::Text => self.on_message(frame.payload()),
            OpCode::Binary => {
                let refusal = br#"{"type":"binary"}"#;
                self.on_message(refusal);
            }
            OpCode::Close => {
                // The client leaves: whatever runs is dropped now. The socket answers the close
                // (yawc queues the reply) and the next read ends the session.
                self.running = None;
                self.queue.clear();
            }
            _ => {}
        }
        Next::Continue
    }

    /// A text message from the client.
    fn on_message(&mut self, text: &[u8]) {
        let ask = match &mut self.protocol {
            Protocol::Responses => responses::on_message(text, &mut self.out),
            Protocol::Realtime(session) => session.on_message(text, &mut self.out),
        };
        match ask {
            _ if self.closing.is_some() => {}
            None => {}
            Some(Ask::Create(request, style)) => self.create(request, style),
            Some(Ask::Cancel) => self.cancel(),
        }
    }

    /// Starts a response now, or as the API says when one runs already.
    fn create(&mut self, request: GenRequest, style: RealtimeStyle) {
        let Some(running) = &self.running else {
            self.start(&request, style);
            return;
        };
        match &mut self.protocol {
            Protocol::Responses if self.queue.len() < responses::MAX_QUEUED => {
                self.queue.push_back(request);
            }
            Protocol::Responses => self.out.push(responses::queue_full()),
            Protocol::Realtime(session) => session.busy(running.stream.seq(), &mut self.out),
        }
    }

    /// `response.cancel`: the running response stops where it is.
    fn cancel(&mut self) {
        let Protocol::Realtime(session) = &mut self.protocol else {
            return;
        };
        match self.running.take() {
            Some(running) => {
                let seq = running.stream.seq();
                drop(running);
                session.cancelled(seq, &mut self.out);
            }
            None => session.nothing_to_cancel(&mut self.out),
        }
    }

    /// Starts generating `request` now.
    fn start(&mut self, request: &GenRequest, style: RealtimeStyle) {
        let stream = websocket_stream(&self.shared, self.api(), request, style, Instant::now());
        self.running = Some(Running {
            stream: Box::new(stream),
            framer: Framer::new(),
        });
    }

    /// The running response's next frame, or its end (the end is taken with the last frame, so
    /// what follows a response, a close above all, goes out in the same write).
    fn on_response_frame(&mut self, frame: Option<Bytes>) -> Next {
        if let (Some(frame), Some(running)) = (&frame, &mut self.running) {
            running.framer.messages(frame, &mut self.out);
            if !running.stream.is_done() {
                return Next::Continue;
            }
        }
        self.running = None;
        self.served += 1;
        let close = self.shared.config.websocket.close.clone();
        match close {
            Some(close) if self.served >= self.shared.config.websocket.close_after => {
                self.begin_close(close.code, &close.reason);
            }
            _ if self.draining => self.begin_close(GOING_AWAY, "the sim is shutting down"),
            _ => {
                if let Some(next) = self.queue.pop_front() {
                    self.start(&next, RealtimeStyle::default());
                }
            }
        }
        Next::Continue
    }

    /// The sim shuts down: close now if idle, else once the running response is complete.
    fn drain(&mut self) {
        self.draining = true;
        self.queue.clear();
        if self.running.is_none() {
            self.begin_close(GOING_AWAY, "the sim is shutting down");
        }
    }

    /// Sends the server's close frame and waits for the client's.
    fn begin_close(&mut self, code: u16, reason: &str) {
        if self.closing.is_some() {
            return;
        }
        self.queue.clear();
        self.control = Some(Frame::close(CloseCode::from(code), reason));
        self.closing = Some(Instant::now());
    }
}
