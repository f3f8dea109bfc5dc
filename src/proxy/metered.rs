//! The metered body: the egress body reads, stamps and scans the upstream's frames, and a reader
//! task takes over while the client cannot take them.
//!
//! While the client keeps up, the serving connection (the native HTTP/1.1 server by default,
//! hyper's for HTTP/2 and `server.http1_server = "hyper"`) polls the egress body as soon as it can
//! take more, so the body reads the upstream itself: a frame that arrives wakes the client
//! connection's task directly, which stamps it (one clock read) and hands the connection the very
//! same `Bytes`, as a plain proxy would, with no task or channel in between. The connection's
//! egress clock then stamps the frame when its bytes reach the socket. Until a token event has
//! been metered, the body hands a frame over unmetered and the clock has the stream meter it
//! (scan, classification, ledger) right after that write, so a stream's costliest metering
//! (format detection, the walker's first walks) is not on its first token's way to the client;
//! after that the body meters each frame before handing it over. Frames are metered in the order
//! they were read: those handed over unmetered are metered first whenever something must read
//! the ingress side as it stands.
//!
//! A client that reads slowly makes the socket refuse a write; the connection then stops polling
//! the body.
//! The egress clock sees that refusal and hands the stream to its ingress reader task, which keeps
//! reading the upstream at the upstream's cadence, stamping and scanning each frame and queueing
//! it, up to the buffer's bound in bytes and frames; then backpressure reaches the upstream. When
//! the connection polls the body again it takes the queued frames in order, and once the queue is empty it
//! reads the upstream itself again. On HTTP/2 (the request's version says it), where
//! a stream can be held back by flow control without the socket refusing anything, the reader task
//! always does the reading.
//!
//! When the client goes away, the connection drops the egress body, which drops the upstream
//! body at once: the upstream connection closes and the inference server stops generating. When
//! the upstream fails or goes silent, the body returns the error, so the connection aborts the
//! response instead of ending it as if it were complete.

use crate::poison::LockExt;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::time::Sleep;

use super::egress_clock::{Deferred, EgressClock, Standby};
use super::upstream::UpstreamFailure;
use super::BoxError;
use crate::batch::StreamProbe;
use crate::format::{Accounting, ThinkState};
use crate::http1::set_waker;
use crate::metering::backpressure::{Backpressure, Change, StreamBackpressure};
use crate::metering::clock::{FrameStamp, Tick};
use crate::metering::ledger::{IngressEnd, StreamLedger};
use crate::metering::meter::IngressMeter;
use crate::scan::{Framing, Scanner};

/// A frame read from the upstream, stamped and scanned (or, when `deferred`, stamped and to be
/// scanned once it is out).
#[derive(Debug)]
struct MeteredFrame {
    bytes: Bytes,
    stamp: FrameStamp,
    /// Handed over unmetered: its counts come from [`State::unmetered`] once it is out.
    deferred: bool,
}

/// A frame the egress body handed over before metering it, in hand-off order.
#[derive(Debug)]
struct Unmetered {
    /// The frame's bytes, until it is metered.
    bytes: Option<Bytes>,
    /// Its ingress stamp: the read's time, and its counts once metered.
    stamp: FrameStamp,
}

/// What the reader task queued while the client could not take it.
#[derive(Debug)]
enum Queued {
    Data(MeteredFrame),
    Trailers(HeaderMap),
}

/// How the upstream body ended, told to the client once every frame before it went out.
#[derive(Debug)]
enum Ending {
    /// Cleanly.
    Complete,
    /// With an error or a timeout: the response is aborted.
    Failed(StreamError),
}

/// Why a metered stream was aborted, as the client connection sees it.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The upstream body failed; its error kept as it came.
    #[error("the upstream failed mid-stream: {0}")]
    Upstream(#[source] BoxError),
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
    /// The client speaks HTTP/1.x, so the egress body may read the upstream itself; on HTTP/2
    /// the reader task always reads.
    pub client_http1: bool,
    /// The streams the live flush sweeps (`metrics.flush_interval`); `None`: this stream is
    /// recorded only at its end.
    pub live: Option<Arc<crate::live::LiveStreams>>,
    /// Where backpressure is counted and marked; `None`: the stream's stops are not tracked.
    pub backpressure: Option<Arc<Backpressure>>,
}

/// The upstream body, its error boxed with its type (read by [`UpstreamFailure::of_body`]).
type Upstream = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

/// Who reads the upstream now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// The egress body, whenever the connection polls it: the client keeps up.
    Egress,
    /// The reader task: the client cannot take more, or the protocol needs it (HTTP/2).
    Reader,
}

/// Everything about one stream's upstream side, shared by the egress body, the reader task and
/// the connection's egress clock. Each takes the lock for the length of one poll, so it is never
/// contended while the client keeps up (only the egress body takes it).
struct StreamShared {
    state: Mutex<State>,
    ledger: Arc<StreamLedger>,
    clock: Arc<EgressClock>,
    buffer_bytes: usize,
    buffer_frames: usize,
    idle_timeout: Duration,
    /// HTTP/1.x: the egress body may read the upstream itself.
    inline: bool,
    /// Where the stream's backpressure is counted and marked.
    backpressure: Option<Arc<Backpressure>>,
}

struct State {
    /// `None` once the upstream ended or the client went away.
    upstream: Option<Upstream>,
    /// The ingress side of the ledger; `None` once handed to the stream ledger.
    meter: Option<IngressMeter>,
    reading: Reading,
    /// Frames the reader task read while the client could not take them, in order.
    queue: VecDeque<Queued>,
    /// Their bytes, against `buffer_bytes`.
    queued_bytes: usize,
    /// Frames the egress body handed over unmetered, until they are out: metered when they
    /// are, or earlier when the next frame must be metered at once, the client blocks, the
    /// reader parks or the upstream side ends (so frames are always metered in order).
    unmetered: VecDeque<Unmetered>,
    /// A token event has been metered: from then on the egress body meters each frame before
    /// handing it over, as the reader task does. Before it, the first token's path, frames are
    /// metered after their write (format detection and the walker's first walks are the
    /// costliest metering a stream has); after it, each frame is metered before its hand-off,
    /// where the live figures and the batch detector see it at once. (Deferring every frame
    /// looked 5-7 % dearer in CPU per event, but one binary run under both names differed by
    /// 12 % in the same bench: that comparison cannot tell; the instructions per event did not
    /// move.)
    token_metered: bool,
    /// How the upstream ended, once it did; delivered after the queue.
    ending: Option<Ending>,
    /// When the last frame (or the stream) began, for the idle timeout.
    last_read: Tick,
    /// The last read found a frame, so the metering state was just touched and the next read
    /// need not prefetch it (the connection reads again after each frame, and that read usually finds
    /// nothing).
    metering_warm: bool,
    /// Fires at the idle deadline; moved on lazily, not per frame.
    idle: Pin<Box<Sleep>>,
    /// The waker `idle` will wake (it need not be polled again for the same task).
    idle_waker: Option<Waker>,
    /// The client connection's task, when the egress body waits.
    egress_waker: Option<Waker>,
    /// The reader task, when it waits (for its turn, or for room in the queue).
    reader_waker: Option<Waker>,
    reader_spawned: bool,
    /// The egress body was dropped: the client is gone.
    closed: bool,
    /// The batch detector's side of this stream, fed per token-bearing frame.
    probe: Option<StreamProbe>,
    /// The stream's stops on a full queue (backpressure).
    held: StreamBackpressure,
}

impl std::fmt::Debug for StreamShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamShared")
            .field("inline", &self.inline)
            .finish_non_exhaustive()
    }
}

/// Starts metering an upstream body and returns the egress body that the client's response
/// carries. `idle` becomes the stream's idle timer: the request's own timer, already armed
/// while the response head was awaited (a timer armed anew here, before the first frame is
/// written, would be earlier than the event loop's next wake-up, which costs a write to its
/// eventfd and a spurious return of its wait on the first token's path). Moved here to no
/// later than the idle timeout from now, if it was later.
pub fn meter<B>(
    upstream: B,
    settings: &MeterSettings,
    accounting: Accounting,
    think: ThinkState,
    ledger: Arc<StreamLedger>,
    clock: Arc<EgressClock>,
    mut idle: Pin<Box<Sleep>>,
) -> EgressBody
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let meter = IngressMeter::new(
        Scanner::new(settings.framing, settings.max_event_bytes),
        accounting,
        think,
        ledger.received(),
        ledger.max_frames(),
    );
    let inline = settings.client_http1;
    let now = Instant::now();
    let latest = tokio::time::Instant::from_std(now + settings.idle_timeout);
    if idle.deadline() > latest {
        idle.as_mut().reset(latest);
    }
    let shared = Arc::new(StreamShared {
        state: Mutex::new(State {
            upstream: Some(Box::pin(upstream.map_err(Into::into))),
            meter: Some(meter),
            reading: if inline {
                Reading::Egress
            } else {
                Reading::Reader
            },
            queue: VecDeque::new(),
            queued_bytes: 0,
            unmetered: VecDeque::new(),
            token_metered: false,
            ending: None,
            last_read: Tick::from_instant(now),
            metering_warm: false,
            idle,
            idle_waker: None,
            egress_waker: None,
            reader_waker: None,
            reader_spawned: !inline,
            closed: false,
            probe: None,
            held: StreamBackpressure::default(),
        }),
        ledger,
        clock: clock.clone(),
        buffer_bytes: settings.buffer_bytes,
        buffer_frames: settings.buffer_frames,
        idle_timeout: settings.idle_timeout,
        inline,
        backpressure: settings.backpressure.clone(),
    });
    if let Some(live) = &settings.live {
        let flush: Arc<dyn crate::live::Flush> = shared.clone();
        live.register(Arc::downgrade(&flush));
    }
    if inline {
        let standby: Arc<dyn Standby> = shared.clone();
        clock.register(Arc::downgrade(&standby));
    } else {
        tokio::spawn(read_ahead(shared.clone()));
    }
    EgressBody {
        shared,
        ended: false,
    }
}

/// What one read of the upstream gave.
enum Read {
    Data(MeteredFrame),
    Trailers(HeaderMap),
    /// The upstream ended (cleanly or not): `State::ending` says how.
    Ended,
}

// === impl StreamShared ===

impl StreamShared {
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        // A poisoned lock means a reader task panicked mid-frame.
        self.state.lock().ok()
    }

    /// Reads the upstream's next frame, stamping and scanning it; on its end, hands the ingress
    /// ledger over. Waits with `cx` (the egress body's or the reader task's).
    fn read(&self, state: &mut State, cx: &mut Context<'_>) -> Poll<Read> {
        // The upstream read below is a system call: have the metering's cold state fetched
        // meanwhile, rather than one line at a time after it.
        if !std::mem::take(&mut state.metering_warm) {
            if let Some(meter) = state.meter.as_ref() {
                meter.prefetch();
            }
            self.ledger.prefetch_egress();
            self.clock.prefetch();
        }
        loop {
            let Some(upstream) = state.upstream.as_mut() else {
                return Poll::Ready(Read::Ended);
            };
            let frame = match upstream.as_mut().poll_frame(cx) {
                Poll::Pending => return self.poll_idle(state, cx),
                Poll::Ready(None) => {
                    self.finish(state, IngressEnd::Complete, Ending::Complete);
                    return Poll::Ready(Read::Ended);
                }
                Poll::Ready(Some(Err(error))) => {
                    self.count_upstream_error(UpstreamFailure::of_body(&*error).kind());
                    let ending = Ending::Failed(StreamError::Upstream(error));
                    self.finish(state, IngressEnd::UpstreamError, ending);
                    return Poll::Ready(Read::Ended);
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let bytes = match frame.into_data() {
                Ok(bytes) => bytes,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => return Poll::Ready(Read::Trailers(trailers)),
                    Err(_) => continue,
                },
            };
            if bytes.is_empty() {
                continue;
            }
            let at = Tick::now();
            state.last_read = at;
            state.metering_warm = true;
            let unmetered = FrameStamp::unmetered(at);
            if state.reading == Reading::Egress && !state.token_metered {
                // The egress body hands the frame over now and meters it once it is out.
                state.unmetered.push_back(Unmetered {
                    bytes: Some(bytes.clone()),
                    stamp: unmetered,
                });
                return Poll::Ready(Read::Data(MeteredFrame {
                    bytes,
                    stamp: unmetered,
                    deferred: true,
                }));
            }
            self.meter_unmetered(state);
            let stamp = self.meter_frame(state, &bytes, unmetered);
            return Poll::Ready(Read::Data(MeteredFrame {
                bytes,
                stamp,
                deferred: false,
            }));
        }
    }

    /// Meters one frame read at `stamp.ingress` (scan, classification, ledger, batch probe) and
    /// returns its stamp with its counts. Frames are metered in the order they were read.
    fn meter_frame(&self, state: &mut State, bytes: &[u8], stamp: FrameStamp) -> FrameStamp {
        let at = stamp.ingress;
        let Some(meter) = state.meter.as_mut() else {
            return stamp; // cannot happen: the meter outlives every frame read
        };
        let counts = meter.frame(bytes, at, self.ledger.metrics());
        state.token_metered |= counts.token_events > 0;
        // A gap that overlapped a stop (the client held the stream back) is not judged.
        let held = state.held.gap_held() && counts.token_events > 0;
        if held {
            meter.ledger_mut().point.hold_gap(false);
            state.held.gap_taken();
        }
        if let Some(probe) = state.probe.as_mut() {
            if held {
                probe.resume(at, counts.token_events);
            } else {
                let model = meter.ledger().model.as_ref();
                probe.token_events(at, counts.token_events, counts.mix, model);
            }
        }
        FrameStamp {
            ingress: at,
            events: counts.events,
            token_events: counts.token_events,
            mix: counts.mix,
            seq: counts.seq,
        }
    }

    /// Meters every frame handed over unmetered that is not yet: before a later frame is, and
    /// before anything else reads the ingress side as it stands (a stop, the client blocked, the
    /// end). They stay queued for their egress stamps.
    fn meter_unmetered(&self, state: &mut State) {
        for i in 0..state.unmetered.len() {
            let Some(bytes) = state.unmetered[i].bytes.take() else {
                continue;
            };
            let stamp = state.unmetered[i].stamp;
            state.unmetered[i].stamp = self.meter_frame(state, &bytes, stamp);
        }
    }

    /// The upstream has nothing now: has it been silent for too long? The timer is moved on only
    /// when it fires, not per frame, and polled (which registers the waker with the timer) only
    /// when the task waiting is not the one it will already wake.
    fn poll_idle(&self, state: &mut State, cx: &mut Context<'_>) -> Poll<Read> {
        loop {
            if !state.idle.is_elapsed() {
                let registered = state
                    .idle_waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()));
                if registered {
                    return Poll::Pending;
                }
                if state.idle.as_mut().poll(cx).is_pending() {
                    state.idle_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
            let deadline = state.last_read.to_instant() + self.idle_timeout;
            if Instant::now() >= deadline {
                self.count_upstream_error("timeout");
                let ending = Ending::Failed(StreamError::Idle(self.idle_timeout));
                self.finish(state, IngressEnd::UpstreamTimeout, ending);
                return Poll::Ready(Read::Ended);
            }
            state
                .idle
                .as_mut()
                .reset(tokio::time::Instant::from_std(deadline));
            state.idle_waker = None;
        }
    }

    /// The upstream side is over: drop the upstream body (closing its connection if unfinished)
    /// and hand the ingress ledger to the stream ledger, once.
    fn finish(&self, state: &mut State, end: IngressEnd, ending: Ending) {
        if let Some(registry) = &self.backpressure {
            if state.held.touched() {
                let (id, route) = (self.ledger.id(), self.ledger.route());
                let received = self.ledger.received();
                state
                    .held
                    .finish(id, route, registry, received, Tick::now());
            }
        }
        state.upstream = None;
        if state.ending.is_none() && end != IngressEnd::ClientGone {
            state.ending = Some(ending);
        }
        self.meter_unmetered(state);
        if let Some(meter) = state.meter.take() {
            let ledger = meter.finish(Tick::now(), self.ledger.metrics());
            if let Some(mut probe) = state.probe.take() {
                probe.prompt_tokens(ledger.prompt_tokens);
            }
            self.ledger.ingress_finished(ledger, end);
        }
        // A parked reader task has nothing left to read: let it end and let go of the stream.
        if let Some(waker) = state.reader_waker.take() {
            waker.wake();
        }
    }

    /// The reader parks on a full queue: a stop begins (the one clock read), unless one is open.
    #[cold]
    fn park(&self, state: &mut State) {
        if self.backpressure.is_none() {
            return;
        }
        self.meter_unmetered(state);
        if state.held.park(Tick::now) == Change::Held {
            if let Some(meter) = state.meter.as_mut() {
                meter.ledger_mut().point.hold_gap(true);
            }
            if let Some(probe) = state.probe.as_ref() {
                probe.hold();
            }
        }
    }

    /// The client took a queued frame: an open stop ends; with the queue now empty, so does the
    /// episode. Reads the clock only when either is open.
    #[inline]
    fn taken(&self, state: &mut State) {
        if !state.held.in_episode() {
            return;
        }
        let Some(registry) = self.backpressure.as_deref() else {
            return;
        };
        let route = self.ledger.route();
        let change = if state.queue.is_empty() {
            let received = self.ledger.received();
            state.held.drained(route, registry, received, Tick::now())
        } else {
            state.held.taken(route, registry, Tick::now)
        };
        if let (Change::Released(at), Some(probe)) = (change, state.probe.as_ref()) {
            probe.release(at);
        }
    }

    /// The frame goes to the serving connection now: register it with the connection's egress
    /// clock (an unmetered one with the stream, which meters it once it is out).
    fn handoff(self: &Arc<Self>, frame: &MeteredFrame) {
        let len = frame.bytes.len();
        if frame.deferred {
            let stream: Arc<dyn Deferred> = self.clone();
            self.clock.handoff_deferred(len, frame.stamp, stream);
        } else {
            self.clock
                .handoff(len, &self.ledger, frame.stamp, self.inline);
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

impl crate::live::Flush for StreamShared {
    /// Lends the ingress ledger, under the lock each poll takes, to the stream ledger's flush.
    /// Once the ingress side has ended its ledger is the stream ledger's, recorded at the end.
    fn flush(&self) {
        let Some(mut state) = self.lock() else { return };
        if let Some(meter) = state.meter.as_mut() {
            self.ledger.flush_live(meter.ledger_mut());
        }
    }
}

impl Deferred for StreamShared {
    /// The oldest frame handed over unmetered is out: meter it now (after the write that
    /// carried it) unless something before had to, then stamp it out.
    fn metered_out(&self, ingress: FrameStamp, at: Tick, write_seq: u64) {
        let stamp = match self.lock() {
            Some(mut guard) => {
                let state = &mut *guard;
                match state.unmetered.pop_front() {
                    Some(Unmetered {
                        bytes: Some(bytes),
                        stamp,
                    }) => self.meter_frame(state, &bytes, stamp),
                    Some(Unmetered { bytes: None, stamp }) => stamp,
                    None => {
                        debug_assert!(false, "a deferred frame out that the stream does not hold");
                        ingress
                    }
                }
            }
            None => ingress, // a reader task panicked: the frame is out all the same
        };
        self.ledger.egress_frame(at, write_seq, &stamp);
    }
}

impl Standby for StreamShared {
    /// The client's socket refused a write: the connection will not poll the egress body until
    /// it drains,
    /// so the reader task reads the upstream meanwhile.
    fn client_blocked(self: Arc<Self>) {
        let Some(mut state) = self.lock() else {
            return;
        };
        if state.closed || state.upstream.is_none() || state.reading == Reading::Reader {
            return;
        }
        // The frames handed over wait for the socket now: meter them, as the reader task will
        // meter what it reads next.
        self.meter_unmetered(&mut state);
        state.reading = Reading::Reader;
        if state.reader_spawned {
            if let Some(waker) = state.reader_waker.take() {
                waker.wake();
            }
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            state.reader_spawned = true;
            drop(state);
            runtime.spawn(read_ahead(self));
        }
    }
}

/// The reader task: reads the upstream while it is its turn, queueing frames up to the buffer's
/// bound, and ends with the upstream or when the client goes away.
async fn read_ahead(shared: Arc<StreamShared>) {
    let _exit = WakeEgressOnExit(shared.clone());
    poll_fn(|cx| {
        let Some(mut guard) = shared.lock() else {
            return Poll::Ready(());
        };
        let state = &mut *guard;
        loop {
            if state.closed || state.upstream.is_none() {
                return Poll::Ready(());
            }
            let full = state.queued_bytes >= shared.buffer_bytes
                || state.queue.len() >= shared.buffer_frames;
            if state.reading == Reading::Egress || full {
                if full && state.reading == Reading::Reader {
                    shared.park(state);
                }
                set_waker(&mut state.reader_waker, cx);
                return Poll::Pending;
            }
            let read = match shared.read(state, cx) {
                Poll::Pending => {
                    // Also kept here, not only in the upstream: should the egress body take the
                    // reading back (and with it the upstream's waker) and then end, the task must
                    // still be woken to let go of the stream.
                    set_waker(&mut state.reader_waker, cx);
                    return Poll::Pending;
                }
                Poll::Ready(read) => read,
            };
            match read {
                Read::Data(frame) => {
                    state.queued_bytes += frame.bytes.len();
                    state.queue.push_back(Queued::Data(frame));
                }
                Read::Trailers(trailers) => state.queue.push_back(Queued::Trailers(trailers)),
                Read::Ended => {}
            }
            if let Some(waker) = state.egress_waker.take() {
                waker.wake();
            }
        }
    })
    .await
}

/// Wakes the egress body when the reader task ends, however it ends. Should the task panic (the
/// lock is then poisoned) or be cancelled, the egress body sees it at once and aborts the response
/// (`ReaderGone`) instead of waiting for a frame that will never come.
struct WakeEgressOnExit(Arc<StreamShared>);

impl Drop for WakeEgressOnExit {
    fn drop(&mut self) {
        let mut state = self.0.state.lock_or_recover();
        if let Some(waker) = state.egress_waker.take() {
            waker.wake();
        }
    }
}

/// The client's response body of a metered stream: the upstream's frames, untouched.
#[derive(Debug)]
pub struct EgressBody {
    shared: Arc<StreamShared>,
    ended: bool,
}

/// Ends the body (`ended` is its flag) the way the upstream ended.
fn end(ended: &mut bool, ending: Ending) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    *ended = true;
    Poll::Ready(match ending {
        Ending::Complete => None,
        Ending::Failed(e) => Some(Err(Box::new(e))),
    })
}

impl Body for EgressBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let shared = &this.shared;
        let Some(mut guard) = shared.lock() else {
            return end(&mut this.ended, Ending::Failed(StreamError::ReaderGone));
        };
        let state = &mut *guard;
        // First what the reader task queued while the client could not take it, in order.
        if let Some(queued) = state.queue.pop_front() {
            return Poll::Ready(Some(Ok(match queued {
                Queued::Data(frame) => {
                    state.queued_bytes -= frame.bytes.len();
                    shared.taken(state);
                    if let Some(waker) = state.reader_waker.take() {
                        waker.wake(); // there is room again
                    }
                    shared.handoff(&frame);
                    Frame::data(frame.bytes)
                }
                Queued::Trailers(trailers) => Frame::trailers(trailers),
            })));
        }
        if let Some(ending) = state.ending.take() {
            return end(&mut this.ended, ending);
        }
        if !shared.inline {
            if state.upstream.is_none() {
                // The reader task stopped without an ending: it was cancelled.
                return end(&mut this.ended, Ending::Failed(StreamError::ReaderGone));
            }
            set_waker(&mut state.egress_waker, cx);
            return Poll::Pending;
        }
        // The connection polls: the client keeps up, so read the upstream here.
        state.reading = Reading::Egress;
        match shared.read(state, cx) {
            Poll::Pending => {
                // Kept for the reader task, should the client block before the next frame.
                set_waker(&mut state.egress_waker, cx);
                Poll::Pending
            }
            Poll::Ready(Read::Data(frame)) => {
                shared.handoff(&frame);
                Poll::Ready(Some(Ok(Frame::data(frame.bytes))))
            }
            Poll::Ready(Read::Trailers(trailers)) => {
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(Read::Ended) => {
                let ending = state
                    .ending
                    .take()
                    .unwrap_or(Ending::Failed(StreamError::ReaderGone));
                end(&mut this.ended, ending)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

impl EgressBody {
    /// Feeds this stream's ingress to the batch detector; before the first poll.
    pub fn attach_probe(&self, probe: StreamProbe) {
        if let Some(mut state) = self.shared.lock() {
            state.probe = Some(probe);
        }
    }
}

impl Drop for EgressBody {
    /// The serving connection is done with the body. With a `content-length` it never asks for
    /// the end: an
    /// upstream that has given all its bytes is complete. Otherwise, if the upstream is still
    /// open, the client went away, so the upstream request is dropped now and the stream counts
    /// as cancelled.
    fn drop(&mut self) {
        let shared = &self.shared;
        let Some(mut state) = shared.lock() else {
            return;
        };
        state.closed = true;
        state.queue.clear();
        let end = match &state.upstream {
            Some(upstream) if upstream.is_end_stream() => IngressEnd::Complete,
            _ => IngressEnd::ClientGone,
        };
        shared.finish(&mut state, end, Ending::Complete);
        if let Some(waker) = state.reader_waker.take() {
            waker.wake();
        }
    }
}
