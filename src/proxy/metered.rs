//! The metered body: an ingress reader task and the egress body it feeds.
//!
//! The ingress reader polls the upstream body as soon as bytes arrive, stamps each frame, scans it
//! for events and hands the very same `Bytes` on through a buffer bounded in bytes and frames.
//! Because it runs as its own task, a client that reads slowly does not delay the ingress stamps:
//! they keep the upstream's cadence until the buffer bound is hit and backpressure reaches the
//! upstream. The egress body gives hyper each frame untouched and registers it with the
//! connection's egress clock, which stamps it when its bytes reach the socket.
//!
//! When the client goes away, hyper drops the egress body; the reader sees its channel close and
//! drops the upstream body at once, which closes the upstream connection, so the inference server
//! stops generating. When the upstream fails, the reader passes the error on and the egress body
//! returns it, so hyper aborts the response instead of ending it as if it were complete.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, Semaphore};

use super::egress_clock::EgressClock;
use super::BoxError;
use crate::format::Accounting;
use crate::ledger::{IngressEnd, StreamLedger};
use crate::meter::IngressMeter;
use crate::scan::{Framing, Scanner};

/// A frame on its way from the ingress reader to the egress body.
#[derive(Debug)]
struct MeteredFrame {
    bytes: Bytes,
    ingress: Instant,
    events: u32,
    token_events: u32,
    /// Place in the stream's timeline, when kept there.
    seq: Option<u32>,
    /// Buffer budget the frame holds until it is handed to hyper.
    permits: u32,
}

#[derive(Debug)]
enum Message {
    Data(MeteredFrame),
    Trailers(HeaderMap),
    Error(StreamError),
    /// The upstream body ended cleanly. A channel that closes without it (a reader that
    /// panicked) aborts the response rather than ending it as if complete.
    End,
}

/// Why a metered stream was aborted, as the client connection sees it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamError {
    /// The upstream body failed.
    #[error("the upstream failed mid-stream: {0}")]
    Upstream(String),
    /// The upstream went silent.
    #[error("the upstream sent nothing for {0:?}")]
    Idle(Duration),
    /// The ingress reader stopped without saying why (a bug: it panicked).
    #[error("the stream's ingress reader stopped unexpectedly")]
    ReaderGone,
}

/// What the metering of one stream needs.
#[derive(Debug, Clone)]
pub struct MeterSettings {
    /// How the body splits into events.
    pub framing: Framing,
    /// Bound on a scanner's partial event.
    pub max_event_bytes: usize,
    /// Bound on bytes between ingress and egress.
    pub buffer_bytes: usize,
    /// Bound on frames between ingress and egress.
    pub buffer_frames: usize,
    /// Longest silence between upstream frames.
    pub idle_timeout: Duration,
}

/// Starts metering an upstream body: spawns its ingress reader and returns the egress body that
/// the client's response carries.
pub fn meter<B>(
    upstream: B,
    settings: &MeterSettings,
    accounting: Accounting,
    ledger: Arc<StreamLedger>,
    clock: Arc<EgressClock>,
) -> EgressBody
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::error::Error + Send + 'static,
{
    let (tx, rx) = mpsc::channel(settings.buffer_frames);
    let budget = Arc::new(Semaphore::new(settings.buffer_bytes));
    let reader = IngressReader {
        tx,
        budget: budget.clone(),
        budget_max: settings.buffer_bytes,
        ledger: ledger.clone(),
        meter: IngressMeter::new(
            Scanner::new(settings.framing, settings.max_event_bytes),
            accounting,
            ledger.received(),
            ledger.max_frames(),
        ),
        idle_timeout: settings.idle_timeout,
    };
    tokio::spawn(reader.run(upstream));
    EgressBody {
        rx,
        budget,
        ledger,
        clock,
        ended: false,
    }
}

/// Reads the upstream body; owns the ingress side of the ledger.
struct IngressReader {
    tx: mpsc::Sender<Message>,
    budget: Arc<Semaphore>,
    budget_max: usize,
    ledger: Arc<StreamLedger>,
    meter: IngressMeter,
    idle_timeout: Duration,
}

// === impl IngressReader ===

impl IngressReader {
    async fn run<B>(mut self, mut upstream: B)
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::error::Error + Send + 'static,
    {
        let idle = tokio::time::sleep(self.idle_timeout);
        tokio::pin!(idle);
        let mut failure = None;
        let end = loop {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + self.idle_timeout);
            let next = tokio::select! {
                biased;
                _ = self.tx.closed() => break IngressEnd::ClientGone,
                _ = &mut idle => {
                    self.count_upstream_error("timeout");
                    failure = Some(StreamError::Idle(self.idle_timeout));
                    break IngressEnd::UpstreamTimeout;
                }
                frame = upstream.frame() => frame,
            };
            let frame = match next {
                None => break IngressEnd::Complete,
                Some(Err(e)) => {
                    let message = e.to_string();
                    self.count_upstream_error(body_failure_kind(&e));
                    failure = Some(StreamError::Upstream(message));
                    break IngressEnd::UpstreamError;
                }
                Some(Ok(frame)) => frame,
            };
            let bytes = match frame.into_data() {
                Ok(bytes) => bytes,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        if self.tx.send(Message::Trailers(trailers)).await.is_err() {
                            break IngressEnd::ClientGone;
                        }
                    }
                    continue;
                }
            };
            if bytes.is_empty() {
                continue;
            }
            let at = Instant::now();
            let metered = self.scan(bytes, at);
            let permits = metered.permits;
            let acquired = tokio::select! {
                biased;
                _ = self.tx.closed() => break IngressEnd::ClientGone,
                permit = self.budget.acquire_many(permits) => permit,
            };
            match acquired {
                Ok(permit) => permit.forget(),
                Err(_) => break IngressEnd::ClientGone,
            }
            if self.tx.send(Message::Data(metered)).await.is_err() {
                break IngressEnd::ClientGone;
            }
        };
        drop(upstream); // closes the upstream connection now if the stream did not finish
                        // Waits for buffer room like any frame: an error must reach the client, or it would
                        // see a clean end. Fails at once if the client is gone.
        let last = match (end, failure) {
            (_, Some(e)) => Some(Message::Error(e)),
            (IngressEnd::Complete, None) => Some(Message::End),
            _ => None,
        };
        if let Some(last) = last {
            let _ = self.tx.send(last).await;
        }
        let ledger = self.meter.finish(Instant::now(), self.ledger.metrics());
        self.ledger.ingress_finished(ledger, end);
    }

    /// Meters one frame; the bytes pass through untouched.
    fn scan(&mut self, bytes: Bytes, at: Instant) -> MeteredFrame {
        let counts = self.meter.frame(&bytes, at, self.ledger.metrics());
        let permits = bytes.len().min(self.budget_max).min(u32::MAX as usize) as u32;
        MeteredFrame {
            bytes,
            ingress: at,
            events: counts.events,
            token_events: counts.token_events,
            seq: counts.seq,
            permits,
        }
    }

    fn count_upstream_error(&self, kind: &str) {
        self.ledger
            .metrics()
            .upstream_errors
            .with_label_values(&[self.ledger.route(), kind])
            .inc();
    }
}

/// The `kind` of an upstream body failure: `reset` when the connection was lost (reset, aborted,
/// or closed before the body's end: hyper reports those as a body error whose cause is an I/O
/// error, so the cause is what tells), `protocol` when the upstream sent something that is not
/// HTTP.
fn body_failure_kind(error: &(dyn std::error::Error + 'static)) -> &'static str {
    use std::io::ErrorKind;
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            ) {
                return "reset";
            }
        }
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return "reset";
        }
        let text = e.to_string();
        if text.contains("reset") || text.contains("closed") {
            return "reset";
        }
        next = e.source();
    }
    "protocol"
}

/// The client's response body of a metered stream: the upstream's frames, untouched.
#[derive(Debug)]
pub struct EgressBody {
    rx: mpsc::Receiver<Message>,
    budget: Arc<Semaphore>,
    ledger: Arc<StreamLedger>,
    clock: Arc<EgressClock>,
    ended: bool,
}

impl Body for EgressBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let message = ready!(self.rx.poll_recv(cx));
        Poll::Ready(match message {
            Some(Message::Data(frame)) => {
                self.budget.add_permits(frame.permits as usize);
                self.clock.handoff(
                    frame.bytes.len(),
                    &self.ledger,
                    frame.ingress,
                    frame.events,
                    frame.token_events,
                    frame.seq,
                );
                Some(Ok(Frame::data(frame.bytes)))
            }
            Some(Message::Trailers(trailers)) => Some(Ok(Frame::trailers(trailers))),
            Some(Message::Error(e)) => {
                self.ended = true;
                Some(Err(Box::new(e)))
            }
            Some(Message::End) => {
                self.ended = true;
                None
            }
            None => {
                self.ended = true;
                Some(Err(Box::new(StreamError::ReaderGone)))
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
