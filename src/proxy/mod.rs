//! The metering proxy: listener, router, forwarder and the metered body.
//!
//! - [`listener`] accepts connections (HTTP/1.1 and HTTP/2) and wraps each one's IO in the
//!   [`egress_clock`], so frames are stamped when their bytes reach the client socket;
//! - [`router`] gives each request its `route` label and upstream;
//! - [`forward`] sends it upstream through a pooled client and builds the response, or answers
//!   a [`refusal`] (a JSON error that knows its status);
//! - [`metered`] meters a streamed response: an ingress reader task and the egress body;
//! - [`body`], [`client_body`] and [`headers`] are the small pieces those share;
//! - [`serve`] is `metronome serve`: runtime, signals, and serving until SIGTERM.

pub mod beacon;
pub mod body;
pub mod client_body;
pub mod egress_clock;
pub mod forward;
pub mod head_deadline;
pub mod headers;
pub mod joined_writes;
pub mod listener;
pub mod metered;
pub mod opening;
pub mod refusal;
pub mod reload;
pub mod rewrite;
pub mod router;
pub mod serve;
pub mod tunnel;
pub mod upstream;
pub mod usage_body;
pub mod workers;

use crate::poison::RwLockExt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use http::{header, HeaderValue, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ClientKind;
use crate::config::{Config, Threading};
use crate::http1::client::Http1Client;
use crate::http1::request_form;
use crate::metrics::{status_class, Metrics, ModelLabels};
use crate::timeline::StreamRegistry;
use crate::tls;
use body::ProxyBody;
use router::Router;
pub use upstream::UpstreamClient;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The metrics could not be registered.
    #[error("cannot register the metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The TLS material could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
}

/// The error type of response bodies: anything that aborts a response.
pub use crate::http1::BoxError;

/// Hands out stream IDs: unique, and not to be guessed from another one.
///
/// Whoever holds a stream's ID may post its one beacon and read its timeline, so an ID must not
/// say anything about the next: each is 128 bits from the thread's CSPRNG (ChaCha, seeded by
/// the OS), written as [`StreamIds::LEN`] lowercase hex digits. (A per-process prefix and a
/// sequence number would let a client that saw its own ID claim the next users' beacons.)
#[derive(Debug, Default)]
pub struct StreamIds;

// === impl StreamIds ===

impl StreamIds {
    /// The length of every ID, in ASCII characters (32 hex digits: 128 bits).
    pub const LEN: usize = 32;

    fn new() -> Self {
        StreamIds
    }

    /// The next ID: [`Self::LEN`] lowercase hex digits of fresh random bits.
    pub fn next(&self) -> String {
        crate::hex::u128_text(rand::random::<u128>())
    }
}

/// Everything request handling shares, built once at start.
#[derive(Debug)]
pub struct ProxyState {
    /// The configuration metronome started with. What a reload cannot change (listeners,
    /// timeouts, buffer bounds, buckets) is read from here.
    pub config: Arc<Config>,
    /// What a SIGHUP reload swaps (see [`reload`]): a lock held only to clone two `Arc`s, so a
    /// request takes one consistent snapshot and streams in flight keep theirs.
    live: RwLock<Live>,
    /// TLS towards https upstreams, shared by every worker's client.
    upstream_tls: rustls::ClientConfig,
    /// The metric contract.
    pub metrics: Arc<Metrics>,
    /// Stream IDs for the response header.
    pub stream_ids: StreamIds,
    /// Set on SIGTERM: `/readyz` answers 503 so load balancers stop sending.
    pub draining: AtomicBool,
    /// Recent streams and their timelines; who may send a beacon.
    pub registry: Arc<StreamRegistry>,
    /// The listener's certificate, reloadable; `None` for plain HTTP.
    pub tls: Option<Arc<tls::ReloadableCert>>,
    /// Requests in flight (`limits.max_requests`).
    pub requests_in_flight: Arc<tokio::sync::Semaphore>,
    /// Open client connections (`limits.max_connections`), over all workers.
    pub connections: Arc<tokio::sync::Semaphore>,
    /// The metered streams in flight, swept every `metrics.flush_interval` (the live flush).
    pub live_streams: Arc<crate::live::LiveStreams>,
    /// Batch-wide hitches and episodes per upstream (`[batch]`, docs/batch.md).
    pub batch: Arc<crate::batch::BatchDetector>,
    /// Backpressure: its counters and each finished stream's marks.
    pub backpressure: Arc<crate::metering::backpressure::Backpressure>,
    /// The span queue, when traces are on (`[otlp] traces = true`): the forwarder makes each
    /// stream's span context, the registry offers each finished stream, the exporter drains it.
    pub spans: Option<Arc<crate::otlp::traces::SpanSink>>,
    /// WebSocket tunnels' two families (`metronome_websocket_connections_*`).
    pub tunnel_metrics: tunnel::TunnelMetrics,
}

impl crate::admin::AdminView for ProxyState {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn registry(&self) -> &StreamRegistry {
        &self.registry
    }

    fn batch(&self) -> &crate::batch::BatchDetector {
        &self.batch
    }

    fn backpressure(&self) -> Option<&crate::metering::backpressure::Backpressure> {
        Some(&self.backpressure)
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    fn live_config(&self) -> Arc<Config> {
        ProxyState::live_config(self)
    }

    fn check_form(
        &self,
        head: &http::request::Parts,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        request_form::check(&head.method, &head.uri, head.version, &head.headers)?;
        Ok(())
    }
}

/// Warns at startup when an `https://` upstream will be verified against the system trust store
/// and that store is empty (an image without ca-certificates): otherwise the first request would
/// be the first word of it.
fn warn_if_https_meets_no_roots(config: &Config) {
    if config.upstream_tls.ca.is_some() {
        return;
    }
    let https = std::iter::once(config.server.upstream.to_string())
        .chain(config.routes.iter().map(|r| r.upstream.to_string()))
        .find(|u| u.starts_with("https://"));
    if let Some(upstream) = https {
        if tls::system_root_count() == 0 {
            tracing::warn!(
                %upstream,
                "the system trust store is empty, so no https:// upstream can be verified: install ca-certificates or set upstream_tls.ca"
            );
        }
    }
}

// === impl ProxyState ===

impl ProxyState {
    /// Builds the shared state: metrics, router, TLS and the pooled client.
    pub fn new(config: Config) -> Result<Self, StartError> {
        let metrics = Metrics::with_native(
            &config.buckets,
            ModelLabels::new(&config.models.allow, config.models.max),
            config.metering.stall_threshold,
            &config.metrics.native,
        )?;
        // `metrics.names = "otel" | "both"`: the GenAI semconv histograms on /metrics too.
        let naming = crate::otlp::names::Naming::new(
            &config,
            std::env::var("OTEL_SEMCONV_STABILITY_OPT_IN")
                .ok()
                .as_deref(),
        );
        if let Some(semconv) =
            crate::otlp::prometheus::SemconvCollector::new(&naming, &metrics.histograms)?
        {
            metrics.register(Box::new(semconv))?;
        }
        let upstream_tls = tls::client_config(
            config.upstream_tls.ca.as_deref(),
            config
                .upstream_tls
                .client_cert
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path())),
        )?;
        warn_if_https_meets_no_roots(&config);
        let listener_tls = match &config.tls {
            Some(t) => Some(Arc::new(tls::ReloadableCert::load(&t.cert, &t.key)?)),
            None => None,
        };
        let tunnel_metrics = tunnel::TunnelMetrics::register(&metrics)?;
        let metrics = Arc::new(metrics);
        let spans = match &config.otlp {
            Some(otlp) if otlp.traces => Some(crate::otlp::traces::SpanSink::new(
                metrics.clone(),
                otlp.traces_queue,
                otlp.traces_queue_bytes,
            )?),
            _ => None,
        };
        let registry = Arc::new(
            StreamRegistry::new(config.timeline.max_streams, config.timeline.max_frames)
                .with_frame_sizes(config.timeline.frame_sizes)
                .with_sink(
                    spans
                        .clone()
                        .map(|s| s as Arc<dyn crate::timeline::FinishedSink>),
                ),
        );
        let requests_in_flight = Arc::new(tokio::sync::Semaphore::new(config.limits.max_requests));
        let connections = Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections));
        let config = Arc::new(config);
        let batch = crate::batch::BatchDetector::new(
            config.batch,
            metrics.clone(),
            &config.server.upstream,
        )?;
        let backpressure = crate::metering::backpressure::Backpressure::register(&metrics)?;
        Ok(ProxyState {
            tunnel_metrics,
            batch,
            backpressure,
            spans,
            tls: listener_tls,
            requests_in_flight,
            connections,
            live: RwLock::new(Live {
                router: Arc::new(Router::new(&config)),
                config: config.clone(),
            }),
            config,
            upstream_tls,
            metrics,
            stream_ids: StreamIds::new(),
            draining: AtomicBool::new(false),
            registry,
            live_streams: Arc::default(),
        })
    }

    /// A new pooled upstream client (http and https); request bodies are streamed through it,
    /// never buffered. Under `threading = "per_core"` every worker has its own, so an upstream
    /// connection is read on the thread that serves its client. Plain-http upstreams go through
    /// metronome's own HTTP/1.1 client unless `server.upstream_client = "hyper"`.
    pub fn upstream_client(&self) -> UpstreamClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(self.config.timeouts.connect));
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.upstream_tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        // The idle timeout needs a timer: without one hyper-util never evicts an idle
        // connection, and every connection of a past burst stays open. An expired connection is
        // also never handed out (hyper-util checks on checkout).
        let hyper = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(self.config.timeouts.upstream_idle)
            .pool_timer(TokioTimer::new())
            .build(connector);
        let native = (self.config.server.upstream_client == ClientKind::Native).then(|| {
            Http1Client::new(
                self.config.timeouts.connect,
                self.config.timeouts.upstream_idle,
            )
        });
        UpstreamClient::new(native, hyper)
    }

    /// The routing table in force now; take it once per request.
    pub fn router(&self) -> Arc<Router> {
        self.live().router
    }

    /// The configuration in force now: the start configuration with what reloads changed.
    pub fn live_config(&self) -> Arc<Config> {
        self.live().config
    }

    fn live(&self) -> Live {
        self.live.read_or_recover().clone()
    }

    /// Puts a reloaded configuration and its routing table in force.
    fn set_live(&self, config: Arc<Config>) {
        let router = Arc::new(Router::new(&config));
        *self.live.write_or_recover() = Live { config, router };
    }

    /// Reloads the listener's certificate from its files; `Ok(false)` when the listener is plain.
    /// New handshakes get the new certificate; on failure the old one stays.
    pub fn reload_tls(&self) -> Result<bool, tls::TlsError> {
        match &self.tls {
            Some(cert) => cert.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// A JSON error answered by metronome itself: `{"error":{"type":…,"message":…}}`.
    pub fn answer_error(
        &self,
        route: &str,
        status: StatusCode,
        kind: &str,
        message: &str,
    ) -> Response<ProxyBody> {
        self.metrics
            .requests
            .with_label_values(&[route, status_class(status)])
            .inc();
        crate::logging::access(&crate::logging::AccessRecord {
            route,
            status: status.as_u16(),
            outcome: kind,
            ..Default::default()
        });
        let body = serde_json::json!({ "error": { "type": kind, "message": message } });
        let mut response = Response::new(ProxyBody::local(body.to_string()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    /// Counts an upstream failure.
    pub fn count_upstream_error(&self, route: &str, kind: &str) {
        self.metrics
            .upstream_errors
            .with_label_values(&[route, kind])
            .inc();
    }
}

/// The reloadable part of [`ProxyState`].
#[derive(Debug, Clone)]
struct Live {
    config: Arc<Config>,
    router: Arc<Router>,
}

/// A running proxy: its bound addresses and the means to stop it. Tests and the demo start one
/// in-process on `127.0.0.1:0`.
#[derive(Debug)]
pub struct ProxyHandle {
    /// Where clients connect.
    pub proxy_addr: SocketAddr,
    /// Where `/metrics` is.
    pub admin_addr: SocketAddr,
    /// The shared state (metrics, config).
    pub state: Arc<ProxyState>,
    /// Stops the proxy listener (then it drains).
    shutdown: watch::Sender<bool>,
    /// Stops the admin listener, after the drain.
    admin_shutdown: watch::Sender<bool>,
    proxy_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    /// The live flush's sweeps, when `metrics.flush_interval` is set; aborted after the drain.
    flush_task: Option<JoinHandle<()>>,
    /// The OTLP exporter, when `[otlp]` is configured; it exports once more at shutdown.
    #[cfg(feature = "otlp")]
    otlp_task: Option<JoinHandle<()>>,
}

/// Connections the kernel may hold completed but not yet accepted on the proxy listener (capped by
/// `net.core.somaxconn`). tokio's `TcpListener::bind` asks for 1,024; a burst of new streams
/// beyond that while metronome is busy overflows the queue, and the client's connection then
/// waits for the kernel's SYN-ACK retries (seconds) or is reset. 4,096 is what nginx and HAProxy
/// are commonly given.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the proxy listener with [`LISTEN_BACKLOG`].
fn bind_proxy_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does on Unix: a restart may bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

// === impl ProxyHandle ===

impl ProxyHandle {
    /// Binds both listeners of `config` and starts serving.
    pub async fn start(config: Config) -> std::io::Result<Self> {
        // "Address in use" alone does not say which of the two: the error names the listener.
        fn named(
            what: &'static str,
            addr: std::net::SocketAddr,
        ) -> impl FnOnce(std::io::Error) -> std::io::Error {
            move |e| std::io::Error::new(e.kind(), format!("the {what} {addr}: {e}"))
        }
        let (listen, admin) = (config.server.listen, config.server.admin);
        let proxy_listener =
            bind_proxy_listener(listen).map_err(named("proxy listener (server.listen)", listen))?;
        let admin_listener = (TcpListener::bind(admin).await)
            .map_err(named("admin listener (server.admin)", admin))?;
        let state = Arc::new(ProxyState::new(config).map_err(std::io::Error::other)?);
        Self::serve(proxy_listener, admin_listener, state)
    }

    /// Reloads the listener's certificate (SIGHUP): kept as it is when the new pair fails.
    pub fn reload_tls(&self) -> Result<bool, tls::TlsError> {
        self.state.reload_tls()
    }

    /// Serves on listeners that are already bound: the proxy listener on `server.workers`
    /// threads of their own (`threading = "per_core"`) or on the calling runtime (`"shared"`).
    pub fn serve(
        proxy_listener: TcpListener,
        admin_listener: TcpListener,
        state: Arc<ProxyState>,
    ) -> std::io::Result<Self> {
        let (shutdown, watch_rx) = watch::channel(false);
        let (admin_shutdown, admin_rx) = watch::channel(false);
        let proxy_addr = proxy_listener.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;
        let proxy_task = match state.config.server.threading {
            Threading::PerCore => workers::spawn(
                proxy_listener,
                state.clone(),
                watch_rx,
                state.config.worker_threads(),
            )?,
            Threading::Shared => tokio::spawn(listener::serve(
                proxy_listener,
                state.clone(),
                state.upstream_client(),
                workers::stopped(watch_rx),
            )),
        };
        let flush_task = state
            .config
            .flush_interval
            .map(|interval| tokio::spawn(state.live_streams.clone().run(interval)));
        #[cfg(feature = "otlp")]
        let sources = crate::otlp::ExportSources {
            config: state.config.clone(),
            metrics: state.metrics.clone(),
            spans: state.spans.clone(),
            batch: state.batch.clone(),
        };
        #[cfg(feature = "otlp")]
        let otlp_task = crate::otlp::spawn(sources, admin_rx.clone());
        let admin_task = tokio::spawn(crate::admin::serve(
            admin_listener,
            state.clone(),
            workers::stopped(admin_rx),
        ));
        Ok(ProxyHandle {
            proxy_addr,
            admin_addr,
            state,
            shutdown,
            admin_shutdown,
            proxy_task,
            admin_task,
            flush_task,
            #[cfg(feature = "otlp")]
            otlp_task,
        })
    }

    /// Stops accepting, drains in-flight streams for up to the configured grace, and returns.
    /// The admin listener stays up through the drain, so `/readyz` answers 503 and the last
    /// streams' metrics can still be scraped; it stops once the drain is over.
    pub async fn shutdown(self) {
        self.state.draining.store(true, Ordering::SeqCst);
        let _ = self.shutdown.send(true);
        let _ = self.proxy_task.await;
        // Every stream has ended and recorded what it had not flushed: the sweeps are over.
        if let Some(task) = self.flush_task {
            task.abort();
        }
        let _ = self.admin_shutdown.send(true);
        let _ = self.admin_task.await;
        #[cfg(feature = "otlp")]
        if let Some(task) = self.otlp_task {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StreamIds;

    #[test]
    fn stream_ids_are_32_hex_digits_that_share_nothing_with_the_last() {
        let ids = StreamIds::new();
        let mut previous = ids.next();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = ids.next();
            assert_eq!(id.len(), StreamIds::LEN, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
            // Neither a shared prefix (a process tag) nor a shared suffix (a counter's high
            // digits): 8 equal leading or trailing digits by chance is one in 2^32.
            assert_ne!(id[..8], previous[..8], "{previous} then {id}");
            assert_ne!(id[24..], previous[24..], "{previous} then {id}");
            assert!(seen.insert(id.clone()), "{id} twice");
            previous = id;
        }
    }
}
