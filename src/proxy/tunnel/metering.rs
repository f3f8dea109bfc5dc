//! Metering inside a tunnel: both directions' bytes go to a [`FrameReader`] as they are read,
//! before they are written on, and the messages of the Responses API's WebSocket mode and of
//! the Realtime API become streams with the same ledger, meter, metrics, timeline and live flush
//! as an SSE stream. Nothing here writes a byte of the tunnel.
//!
//! - The path says the API (`…/responses`, `…/realtime`), unless the route's `format` names one;
//!   any other socket, or one whose handshake negotiated an extension the reader does not know,
//!   is a connection only (its close frames are still read, to tell a closing handshake).
//! - A client's `response.create` starts a stream, received at the read that carried it (TTFT
//!   counts from there); on the Realtime API the server's own `response.created` starts one when
//!   none is open (a turn the server began). One stream is open at a time: a `response.create`
//!   sent while one runs waits for it to end (as the server queues it).
//! - The server's messages go to the stream's accountant; each upstream read that carried any is
//!   one frame, stamped at ingress when read and at egress when its last byte reached the client
//!   socket.
//! - Each stream's `model` label is the one its server events name (`response.created` on the
//!   Responses API), else the one its `response.create` names (`model` or `response.model`), else
//!   the socket's: the model of the Realtime session (`session.model` of the last
//!   `session.created` or `session.updated`), else the upgrade's `?model=`. Names go through
//!   the same bound and folding as an SSE stream's (`ModelLabels::resolve`); one written with
//!   escapes (JSON `\`, URL `%` or `+`) goes unnamed, as on SSE.
//! - The API's end events end the stream with their usage: `response.completed`,
//!   `response.incomplete`, `response.failed` and `error` (Responses), `response.done` (Realtime).
//!   A client's `response.cancel`, or the client's socket closing mid-response, ends it as
//!   `client_cancelled`; the upstream's socket closing mid-response ends it as `upstream_error`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::format::{Accounting, Format};
use crate::metering::clock::{FrameStamp, Tick};
use crate::metering::ledger::{FrameCounts, IngressEnd, StreamInfo, StreamLedger};
use crate::metering::meter::IngressMeter;
use crate::poison::LockExt;
use crate::proxy::ProxyState;
use crate::scan::{Event, Framing, Scanner};
use crate::websocket::{
    Control, ControlFrame, Direction, Extensions, FrameReader, Limits, Message, MessageKind,
    MessageSink,
};

/// The WebSocket APIs whose responses are metered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// The Responses API's WebSocket mode (`format="responses_websocket"`).
    Responses,
    /// The Realtime API (`format="realtime"`).
    Realtime,
}

// === impl Api ===

impl Api {
    /// The API of a socket: the route's format when it names a WebSocket API (or the Responses
    /// API), else the path's last segment; `None` for any other socket.
    pub fn of(configured: Option<Format>, path: &str) -> Option<Api> {
        match configured {
            Some(Format::Realtime) => return Some(Api::Realtime),
            Some(Format::ResponsesWebsocket | Format::Responses) => return Some(Api::Responses),
            _ => {}
        }
        let path = path.trim_end_matches('/');
        if path.ends_with("/responses") {
            Some(Api::Responses)
        } else if path.ends_with("/realtime") {
            Some(Api::Realtime)
        } else {
            None
        }
    }

    /// The `format` label of its streams.
    pub fn format(self) -> Format {
        match self {
            Api::Responses => Format::ResponsesWebsocket,
            Api::Realtime => Format::Realtime,
        }
    }
}

/// What a tunnel's metering starts from.
#[derive(Debug)]
pub struct Setup {
    /// The proxy's shared state (metrics, registry, live flush, stream IDs, configuration).
    pub state: Arc<ProxyState>,
    /// The route label.
    pub route: Arc<str>,
    /// The API the socket speaks, if one metronome meters.
    pub api: Option<Api>,
    /// What the `101` negotiated.
    pub extensions: Extensions,
    /// The stream ID the `101` carried: the first stream's.
    pub first_id: Arc<str>,
    /// The upgrade's `traceparent`, kept with every stream of the socket.
    pub traceparent: Option<String>,
    /// The upgrade's `x-request-id`, kept with every stream of the socket.
    pub request_id: Option<String>,
    /// The upgrade's method, path and request ID, for every stream's access log line.
    pub line: crate::logging::RequestLine,
    /// The route's `<think>` tags, for content that carries the thinking inline.
    pub think: crate::format::ThinkSettings,
    /// The model the upgrade's query names (`?model=`, the Realtime API's), if it names one.
    pub query_model: Option<Box<str>>,
}

/// The model a query string names (`model=…`), when it is written without escapes: a `%` or
/// `+` would need decoding, and a name that needs it goes unnamed, as a JSON name with escapes.
pub fn query_model(query: Option<&str>) -> Option<Box<str>> {
    let value = query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "model")?
        .1;
    (!value.is_empty() && !value.contains(['%', '+'])).then(|| value.into())
}

/// The frames of both directions read as they pass, and the streams they make.
#[derive(Debug)]
pub struct TunnelMeter {
    /// The client's frames; `None` when an unknown extension makes them unreadable.
    client: Option<FrameReader>,
    /// The upstream's frames; `None` likewise.
    upstream: Option<FrameReader>,
    /// A close frame was read from each end: `[client, upstream]`.
    closes: [bool; 2],
    /// The streams, when the socket speaks an API that is metered.
    streams: Option<Box<Streams>>,
}

/// Bytes of a message a reader keeps on a socket that is not metered: enough for nothing but
/// the control frames, which the reader keeps apart.
const UNMETERED_MESSAGE_BYTES: usize = 0;

// === impl TunnelMeter ===

impl TunnelMeter {
    /// The metering of a new tunnel.
    pub fn new(setup: Setup) -> Self {
        let api = setup.api.filter(|_| setup.state.config.metering.enabled);
        let limits = match api {
            Some(_) => Limits::default(),
            None => Limits {
                max_message_bytes: UNMETERED_MESSAGE_BYTES,
                ..Limits::default()
            },
        };
        let reader = |direction| FrameReader::for_extensions(direction, &setup.extensions, limits);
        let client = reader(Direction::ClientToServer);
        let upstream = reader(Direction::ServerToClient);
        let streams = match (api, &upstream) {
            (Some(api), Some(_)) => Some(Box::new(Streams::new(api, setup))),
            _ => None,
        };
        TunnelMeter {
            client,
            upstream,
            closes: [false; 2],
            streams,
        }
    }

    /// Reads bytes the client sent, at `at`, before they are written on.
    pub fn from_client(&mut self, bytes: &[u8], at: Tick) {
        let Some(reader) = &mut self.client else {
            return;
        };
        let mut sink = ClientSink {
            streams: self.streams.as_deref_mut(),
            closed: &mut self.closes[0],
            at,
        };
        reader.feed(bytes, &mut sink);
    }

    /// Reads bytes the upstream sent, at `at`, before they are written on; the streams they
    /// carried messages of get a frame each.
    pub fn from_upstream(&mut self, bytes: &[u8], at: Tick) {
        let Some(reader) = &mut self.upstream else {
            return;
        };
        let mut sink = UpstreamSink {
            streams: self.streams.as_deref_mut(),
            closed: &mut self.closes[1],
            at,
        };
        reader.feed(bytes, &mut sink);
        if let Some(streams) = &mut self.streams {
            streams.close_frames(bytes.len(), at);
        }
    }

    /// The last upstream read's bytes reached the client socket at `at`.
    pub fn delivered(&mut self, at: Tick) {
        if let Some(streams) = &mut self.streams {
            streams.delivered(at);
        }
    }

    /// Both ends sent a close frame: the closing handshake took place.
    pub fn handshake_done(&self) -> bool {
        self.closes == [true, true]
    }

    /// Whether the bytes read from `direction`'s sender so far end between frames.
    pub fn at_frame_boundary(&self, direction: Direction) -> bool {
        let reader = match direction {
            Direction::ClientToServer => &self.client,
            Direction::ServerToClient => &self.upstream,
        };
        reader.as_ref().is_some_and(FrameReader::at_frame_boundary)
    }

    /// The tunnel is over: every stream still open ends with `end`.
    pub fn finish(&mut self, end: IngressEnd) {
        if let Some(streams) = &mut self.streams {
            streams.finish(end, Tick::now());
        }
    }
}

impl Drop for TunnelMeter {
    fn drop(&mut self) {
        // A tunnel dropped without its end (the runtime went away): its streams did not finish.
        self.finish(IngressEnd::ClientGone);
    }
}

/// One metered response: its ledger, and its meter while it runs (under a lock the live flush
/// takes too, never contended otherwise).
#[derive(Debug)]
struct TunnelStream {
    ledger: Arc<StreamLedger>,
    meter: Mutex<Option<IngressMeter>>,
    /// The model its `response.create` or its socket named, for when its own events name none.
    named: Option<Box<str>>,
}

// === impl TunnelStream ===

impl TunnelStream {
    /// Labels the stream with the model its request or socket named, unless its events named
    /// one first (they are the server's word for what answered).
    fn settle_model(&self, meter: &mut IngressMeter, metrics: &crate::metrics::Metrics) {
        if let Some(named) = &self.named {
            if meter.ledger().model.is_none() {
                meter.ledger_mut().model = Some(metrics.models.resolve(Some(named)));
            }
        }
    }
}

impl crate::live::Flush for TunnelStream {
    fn flush(&self) {
        if let Some(meter) = self.meter.lock_or_recover().as_mut() {
            self.ledger.flush_live(meter.ledger_mut());
        }
    }
}

/// A stream's part in the upstream read being delivered.
#[derive(Debug)]
struct Pending {
    stream: Arc<TunnelStream>,
    counts: FrameCounts,
    /// Its frame's ingress stamp, once the read is metered whole.
    stamp: Option<FrameStamp>,
    /// How the stream ended within the read, if it did: it is finished once the read's bytes
    /// reached the client.
    end: Option<IngressEnd>,
}

/// The most `response.create` messages kept waiting while a response runs.
const MAX_QUEUED: usize = 16;

/// The streams of one metered socket.
#[derive(Debug)]
struct Streams {
    api: Api,
    setup: Setup,
    /// The first stream takes the `101`'s ID.
    first_id: Option<Arc<str>>,
    current: Option<Arc<TunnelStream>>,
    /// When each `response.create` sent while a response ran arrived, and the model it named.
    queued: VecDeque<(Tick, Option<Box<str>>)>,
    /// The model the socket's streams take when neither their events nor their
    /// `response.create` name one: the Realtime session's, else the upgrade's `?model=`.
    socket_model: Option<Box<str>>,
    /// Finds `"session.` in a Realtime server message, before it is parsed for its model.
    session_event: Option<memchr::memmem::Finder<'static>>,
    /// The streams the upstream read being delivered carried messages of.
    pending: Vec<Pending>,
    /// Upstream reads delivered to the client so far (the egress ledger's socket writes).
    writes: u64,
}

// === impl Streams ===

impl Streams {
    fn new(api: Api, setup: Setup) -> Self {
        let session_event =
            (api == Api::Realtime).then(|| memchr::memmem::Finder::new(b"\"session.").into_owned());
        Streams {
            api,
            first_id: Some(setup.first_id.clone()),
            socket_model: setup.query_model.clone(),
            setup,
            current: None,
            queued: VecDeque::new(),
            session_event,
            pending: Vec::new(),
            writes: 0,
        }
    }

    /// Opens a stream received at `received`, its `response.create` naming `model` (or not).
    fn open(&mut self, received: Tick, model: Option<Box<str>>) -> Arc<TunnelStream> {
        let state = &self.setup.state;
        let id = self
            .first_id
            .take()
            .unwrap_or_else(|| Arc::from(state.stream_ids.next()));
        let info = StreamInfo {
            id,
            route: self.setup.route.clone(),
            received,
            started_unix_ms: unix_ms(),
            content_type: "websocket".into(),
            traceparent: self.setup.traceparent.clone(),
            request_id: self.setup.request_id.clone(),
            line: self.setup.line.clone(),
            status: 101,
            slo: None,
            span: None,
        };
        // In the beacon window without a key: no client can speak for a tunnel's stream.
        state.registry.started(&info.id, &info.route, None);
        let ledger = StreamLedger::open(state.metrics.clone(), state.registry.clone(), info, None);
        let meter = IngressMeter::new(
            Scanner::new(Framing::Opaque, 0),
            Accounting::for_format(self.api.format()),
            crate::format::ThinkState::new(&self.setup.think),
            received,
            ledger.max_frames(),
        );
        let stream = Arc::new(TunnelStream {
            ledger,
            meter: Mutex::new(Some(meter)),
            named: model.or_else(|| self.socket_model.clone()),
        });
        if state.config.flush_interval.is_some() {
            let flush: Arc<dyn crate::live::Flush> = stream.clone();
            state.live_streams.register(Arc::downgrade(&flush));
        }
        stream
    }

    /// A client's message: `response.create` starts (or queues) a stream, `response.cancel`
    /// ends the one running.
    fn client_message(&mut self, message: &Message<'_>, at: Tick) {
        if message.kind != MessageKind::Text {
            return;
        }
        match message_type(message) {
            Some(b"response.create") => {
                let model = create_model(message);
                if self.current.is_none() {
                    self.current = Some(self.open(at, model));
                } else if self.queued.len() < MAX_QUEUED {
                    self.queued.push_back((at, model));
                }
            }
            Some(b"response.cancel") => self.end_current(IngressEnd::ClientGone, at),
            _ => {}
        }
    }

    /// A server's message, read at `at`: an event of the running stream, or the server's own
    /// start of one (Realtime).
    fn server_message(&mut self, message: &Message<'_>, at: Tick) {
        if message.kind != MessageKind::Text {
            return;
        }
        if let Some(finder) = &self.session_event {
            if finder.find(message.data).is_some() {
                if let Some(model) = session_model(message) {
                    self.socket_model = Some(model);
                }
            }
        }
        if self.current.is_none()
            && self.api == Api::Realtime
            && message_type(message) == Some(b"response.created")
        {
            self.current = Some(self.open(at, None));
        }
        let Some(stream) = self.current.clone() else {
            return;
        };
        let index = match self
            .pending
            .iter()
            .position(|p| Arc::ptr_eq(&p.stream, &stream))
        {
            Some(index) => index,
            None => {
                self.pending.push(Pending {
                    stream: stream.clone(),
                    counts: FrameCounts::default(),
                    stamp: None,
                    end: None,
                });
                self.pending.len() - 1
            }
        };
        let event = Event {
            kind: b"",
            data: message.data,
            truncated: message.oversize,
        };
        let metrics = &self.setup.state.metrics;
        let pending = &mut self.pending[index];
        let meaning = match stream.meter.lock_or_recover().as_mut() {
            Some(meter) => {
                let meaning = meter.event(&event, metrics, &mut pending.counts);
                stream.settle_model(meter, metrics);
                meaning
            }
            None => return,
        };
        // The Responses API's `error` answers the request in progress; the Realtime API's
        // reports a client event that failed and ends no response.
        if meaning.end || (meaning.error && self.api == Api::Responses) {
            pending.end = Some(IngressEnd::Complete);
            self.current = None;
            self.start_queued();
        }
    }

    /// The next waiting `response.create`, if any, becomes the running stream.
    fn start_queued(&mut self) {
        if let Some((received, model)) = self.queued.pop_front() {
            self.current = Some(self.open(received, model));
        }
    }

    /// Ends the running stream with `end` (once the read it is part of is delivered, if any).
    fn end_current(&mut self, end: IngressEnd, at: Tick) {
        let Some(stream) = self.current.take() else {
            return;
        };
        match self
            .pending
            .iter_mut()
            .find(|p| Arc::ptr_eq(&p.stream, &stream))
        {
            Some(pending) => pending.end = Some(end),
            None => self.finish_stream(&stream, end, at),
        }
        self.start_queued();
    }

    /// The upstream read of `len` bytes at `at` is metered whole: each stream it carried
    /// messages of gets its frame.
    fn close_frames(&mut self, len: usize, at: Tick) {
        let metrics = &self.setup.state.metrics;
        for pending in self.pending.iter_mut().filter(|p| p.stamp.is_none()) {
            let mut meter = pending.stream.meter.lock_or_recover();
            let Some(meter) = meter.as_mut() else {
                continue;
            };
            let counts = meter.close_frame(len, at, pending.counts, metrics);
            pending.stamp = Some(FrameStamp {
                ingress: at,
                events: counts.events,
                token_events: counts.token_events,
                mix: counts.mix,
                seq: counts.seq,
            });
        }
    }

    /// The read's bytes reached the client socket at `at`: its frames are stamped, and the
    /// streams that ended in it finish.
    fn delivered(&mut self, at: Tick) {
        if self.pending.is_empty() {
            return;
        }
        self.writes += 1;
        let mut pending = std::mem::take(&mut self.pending);
        for p in pending.drain(..) {
            if let Some(stamp) = &p.stamp {
                p.stream.ledger.egress_frame(at, self.writes, stamp);
            }
            if let Some(end) = p.end {
                self.finish_stream(&p.stream, end, at);
            }
        }
        self.pending = pending;
    }

    /// Hands a stream's ingress ledger over with how it ended; the ledger records itself when
    /// its last holder lets go.
    fn finish_stream(&self, stream: &TunnelStream, end: IngressEnd, at: Tick) {
        let Some(mut meter) = stream.meter.lock_or_recover().take() else {
            return;
        };
        let metrics = &self.setup.state.metrics;
        stream.settle_model(&mut meter, metrics);
        let mut ledger = meter.finish(at, metrics);
        ledger.format = Some(self.api.format());
        stream.ledger.ingress_finished(ledger, end);
    }

    /// The tunnel ended: streams that ended in an undelivered read finish as they ended (their
    /// last frame unstamped), and the running one with `end`.
    fn finish(&mut self, end: IngressEnd, at: Tick) {
        for p in std::mem::take(&mut self.pending) {
            self.finish_stream(&p.stream, p.end.unwrap_or(end), at);
        }
        if let Some(stream) = self.current.take() {
            self.finish_stream(&stream, end, at);
        }
        self.queued.clear();
    }
}

/// The client direction's sink.
struct ClientSink<'a> {
    streams: Option<&'a mut Streams>,
    closed: &'a mut bool,
    at: Tick,
}

impl MessageSink for ClientSink<'_> {
    fn on_message(&mut self, message: Message<'_>) {
        if let Some(streams) = self.streams.as_deref_mut() {
            streams.client_message(&message, self.at);
        }
    }

    fn on_control(&mut self, control: ControlFrame<'_>) {
        *self.closed |= matches!(control.control, Control::Close(_));
    }
}

/// The upstream direction's sink.
struct UpstreamSink<'a> {
    streams: Option<&'a mut Streams>,
    closed: &'a mut bool,
    at: Tick,
}

impl MessageSink for UpstreamSink<'_> {
    fn on_message(&mut self, message: Message<'_>) {
        if let Some(streams) = self.streams.as_deref_mut() {
            streams.server_message(&message, self.at);
        }
    }

    fn on_control(&mut self, control: ControlFrame<'_>) {
        *self.closed |= matches!(control.control, Control::Close(_));
    }
}

/// A message's top-level `type`, without its quotes: parsed when the message is whole, read
/// from its first member when only its beginning was kept (a long `response.create` names its
/// type first, as every client writes it).
fn message_type<'a>(message: &Message<'a>) -> Option<&'a [u8]> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, default, rename = "type")]
        kind: Option<&'a RawValue>,
    }
    if !message.oversize {
        let typed: Typed<'a> = serde_json::from_slice(message.data).ok()?;
        let raw = typed.kind?.get().as_bytes();
        return raw.strip_prefix(b"\"")?.strip_suffix(b"\"");
    }
    let rest = message.data.trim_ascii_start().strip_prefix(b"{")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"type\"")?;
    let rest = rest.trim_ascii_start().strip_prefix(b":")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    (rest[end] == b'"').then(|| &rest[..end])
}

/// The members of a client or server message that name a model.
#[derive(Deserialize)]
struct Naming<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(borrow, default)]
    session: Option<&'a RawValue>,
}

/// An object's `model`, when it is a string without escapes.
fn model_of(object: Option<&RawValue>) -> Option<Box<str>> {
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow, default)]
        model: Option<&'a RawValue>,
    }
    let named: Named<'_> = serde_json::from_str(object?.get()).ok()?;
    crate::format::json::plain_string(named.model?).map(Box::from)
}

/// The model a `response.create` names: its top-level `model` (the Responses API's WebSocket
/// mode) or `response.model`. Read from a whole message only.
fn create_model(message: &Message<'_>) -> Option<Box<str>> {
    if message.oversize {
        return None;
    }
    let naming: Naming<'_> = serde_json::from_slice(message.data).ok()?;
    let top = naming.model.and_then(crate::format::json::plain_string);
    top.map(Box::from).or_else(|| model_of(naming.response))
}

/// The model of a Realtime `session.created` or `session.updated` (`session.model`); `None`
/// for any other message.
fn session_model(message: &Message<'_>) -> Option<Box<str>> {
    if message.oversize {
        return None;
    }
    let naming: Naming<'_> = serde_json::from_slice(message.data).ok()?;
    match naming.kind?.get() {
        r#""session.created""# | r#""session.updated""# => model_of(naming.session),
        _ => None,
    }
}

/// Wall-clock milliseconds since the Unix epoch (for people reading `/streams`).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(data: &[u8], oversize: bool) -> Message<'_> {
        Message {
            kind: MessageKind::Text,
            data,
            oversize,
            compressed: false,
            frames: 1,
            wire_len: data.len() as u64,
            start: 0,
            end: data.len() as u64,
        }
    }

    #[test]
    fn the_path_or_the_route_says_the_api() {
        assert_eq!(Api::of(None, "/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::of(None, "/v1/realtime"), Some(Api::Realtime));
        assert_eq!(Api::of(None, "/team/v1/realtime/"), Some(Api::Realtime));
        assert_eq!(Api::of(None, "/socket"), None);
        assert_eq!(
            Api::of(Some(Format::Realtime), "/socket"),
            Some(Api::Realtime)
        );
        assert_eq!(
            Api::of(Some(Format::OpenAi), "/v1/realtime"),
            Some(Api::Realtime)
        );
    }

    #[test]
    fn models_are_read_from_the_query_the_request_and_the_session() {
        assert_eq!(
            query_model(Some("model=gpt-realtime&x=1")).as_deref(),
            Some("gpt-realtime")
        );
        assert_eq!(query_model(Some("x=1&model=m")).as_deref(), Some("m"));
        assert_eq!(query_model(Some("model=a%2Db")), None);
        assert_eq!(query_model(Some("model=a+b")), None);
        assert_eq!(query_model(Some("model=")), None);
        assert_eq!(query_model(Some("models=m")), None);
        assert_eq!(query_model(None), None);

        let create = |data: &'static [u8]| create_model(&text(data, false));
        let top = br#"{"type":"response.create","model":"gpt-5","input":"hi"}"#;
        assert_eq!(create(top).as_deref(), Some("gpt-5"));
        let nested = br#"{"type":"response.create","response":{"model":"o4-mini"}}"#;
        assert_eq!(create(nested).as_deref(), Some("o4-mini"));
        assert_eq!(
            create(br#"{"type":"response.create","model":"a\u002db"}"#),
            None
        );
        assert_eq!(create(br#"{"type":"response.create","model":7}"#), None);
        assert_eq!(
            create(br#"{"type":"response.create","response":null}"#),
            None
        );
        let cut = text(
            br#"{"type":"response.create","model":"gpt-5","input":"#,
            true,
        );
        assert_eq!(create_model(&cut), None);

        let session = |data: &'static [u8]| session_model(&text(data, false));
        let created = br#"{"event_id":"e","type":"session.created","session":{"model":"rt"}}"#;
        assert_eq!(session(created).as_deref(), Some("rt"));
        let updated = br#"{"type":"session.updated","session":{"id":"s","model":"rt2"}}"#;
        assert_eq!(session(updated).as_deref(), Some("rt2"));
        let other = br#"{"type":"conversation.item.created","session":{"model":"rt"}}"#;
        assert_eq!(session(other), None);
        assert_eq!(session(br#"{"type":"session.updated","session":{}}"#), None);
    }

    #[test]
    fn a_messages_type_is_read_whole_or_from_its_beginning() {
        let whole = text(br#"{"event_id":"e1","type":"response.create"}"#, false);
        assert_eq!(message_type(&whole), Some(&b"response.create"[..]));
        let cut = text(
            br#" { "type" : "response.create", "response": {"input": [{"ty"#,
            true,
        );
        assert_eq!(message_type(&cut), Some(&b"response.create"[..]));
        let nested_first = text(br#"{"response":{"type":"x"},"type":"resp"#, true);
        assert_eq!(message_type(&nested_first), None);
        assert_eq!(message_type(&text(b"not json", false)), None);
        let escaped = text(br#"{"type":"response.\u0063reate"}"#, false);
        assert_eq!(message_type(&escaped), Some(&br"response.\u0063reate"[..]));
    }
}
