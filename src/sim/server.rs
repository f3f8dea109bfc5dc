//! The accept loop: one task per connection (HTTP/1.1 or HTTP/2, detected per connection), and a
//! graceful shutdown that lets streams in flight finish within the drain time.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::batch::{BatchEngine, EngineSettings};
use super::config::{Engine, SimConfig};
use super::stats::SimStats;
use super::timeline::{Timeline, TimelineWriter};

/// HTTP/2 streams one connection may carry at once: enough for a load test over one connection.
const MAX_H2_STREAMS: u32 = 16 * 1024;

/// What every connection and stream of one server shares; read-only apart from atomics.
#[derive(Debug)]
pub(crate) struct SimShared {
    /// The configuration, fixed for the server's life.
    pub config: SimConfig,
    /// The counters the caller may watch.
    pub stats: Arc<SimStats>,
    /// The timeline's sending side, when one is kept.
    pub timeline: Option<Arc<Timeline>>,
    /// The model name as a JSON string literal, escaped once here rather than per chunk.
    pub model_json: Arc<str>,
    /// The next stream's sequence number.
    pub next_seq: AtomicU64,
    /// The shared decode loop, under `--engine batch`.
    pub batch: Option<Arc<BatchEngine>>,
    /// True once the server shuts down: WebSocket sessions close after their running response.
    pub closing: watch::Receiver<bool>,
    /// The next WebSocket session's number.
    pub next_session: AtomicU64,
    /// Base64 of one spoken token's audio (Realtime), made once.
    pub audio_b64: Arc<str>,
    /// The WebSocket sessions' tasks, so a shutdown waits for them (and ends the stragglers).
    sessions: Mutex<JoinSet<()>>,
}

// === impl SimShared ===

impl SimShared {
    /// Runs a WebSocket session in a task the shutdown waits for; finished sessions are
    /// reaped here, so the set holds only the ones alive.
    pub(crate) fn spawn_session(&self, session: impl Future<Output = ()> + Send + 'static) {
        let mut sessions = crate::poison::LockExt::lock_or_recover(&self.sessions);
        while sessions.try_join_next().is_some() {}
        sessions.spawn(session);
    }

    /// Waits up to `drain` for the sessions to close, then ends the rest.
    async fn drain_sessions(&self, drain: Duration) {
        let mut sessions = std::mem::take(&mut *crate::poison::LockExt::lock_or_recover(
            &self.sessions,
        ));
        let drained = tokio::time::timeout(drain, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                open = sessions.len(),
                "sim: closing WebSocket sessions still open after the drain time"
            );
            sessions.shutdown().await;
        }
    }
}

/// One spoken token's audio: `bytes` of a quiet 24 kHz 16-bit tone, base64.
fn token_audio(bytes: usize) -> Arc<str> {
    let samples = (0..bytes / 2).flat_map(|i| {
        let phase = i as f64 * 440.0 * std::f64::consts::TAU / 24_000.0;
        ((phase.sin() * 2000.0) as i16).to_le_bytes()
    });
    let pcm: Vec<u8> = samples.collect();
    base64::engine::general_purpose::STANDARD.encode(pcm).into()
}

/// Serves on `listener` until `shutdown` resolves, updating `stats` as requests come and go.
pub async fn serve_with_stats(
    listener: TcpListener,
    config: SimConfig,
    stats: Arc<SimStats>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    config
        .validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let (timeline, writer) = open_timeline(&config).await?;
    let model_json = serde_json::to_string(&config.model).map_err(std::io::Error::other)?;
    let drain = config.drain;
    let batch = (config.engine == Engine::Batch).then(|| {
        let settings = EngineSettings {
            gap: config.gap,
            prefill_per_token: config.prefill_per_token,
            prefill_chunk: config.prefill_chunk,
            keep_chunks: timeline.is_some(),
        };
        BatchEngine::new(settings, tokio::time::Instant::now())
    });
    let (close_tx, close_rx) = watch::channel(false);
    let audio_b64 = token_audio(config.websocket.audio_bytes_per_token());
    let shared = Arc::new(SimShared {
        batch,
        config,
        stats,
        timeline: timeline.clone(),
        model_json: model_json.into(),
        next_seq: AtomicU64::new(0),
        closing: close_rx.clone(),
        next_session: AtomicU64::new(0),
        audio_b64,
        sessions: Mutex::new(JoinSet::new()),
    });

    let builder = Arc::new(builder());
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(connection(
                        builder.clone(),
                        stream,
                        shared.clone(),
                        close_rx.clone(),
                    ));
                }
                Err(e) => {
                    // Out of file descriptors and kin: back off instead of spinning.
                    tracing::warn!(error = %e, "sim: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = close_tx.send(true);
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "sim: closing connections still open after the drain time"
        );
        connections.shutdown().await;
    }
    shared.drain_sessions(drain).await;
    drop(shared);
    if let (Some(timeline), Some(writer)) = (timeline, writer) {
        finish_timeline(&timeline, writer).await?;
    }
    Ok(())
}

/// The `--timeline` file and its writer, when one is asked for.
async fn open_timeline(
    config: &SimConfig,
) -> std::io::Result<(Option<Arc<Timeline>>, Option<TimelineWriter>)> {
    let Some(path) = &config.timeline else {
        return Ok((None, None));
    };
    let (timeline, writer) = Timeline::create(path).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot create the timeline {}: {e}", path.display()),
        )
    })?;
    Ok((Some(timeline), Some(writer)))
}

/// hyper-util's auto server (HTTP/1.1, or HTTP/2 by its preface) with timers, and HTTP/2's
/// streams per connection bounded.
fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS);
    builder
}

/// Writes the timeline's last lines, and says whether the writer kept up.
async fn finish_timeline(timeline: &Timeline, writer: TimelineWriter) -> std::io::Result<()> {
    let lines = writer.finish().await?;
    let dropped = timeline.dropped();
    if dropped > 0 {
        tracing::warn!(
            lines,
            dropped,
            "sim: timeline writer fell behind; lines were dropped"
        );
    } else {
        tracing::info!(lines, "sim: timeline written");
    }
    Ok(())
}

/// Serves one connection until it ends or shutdown asks it to finish its requests and close.
async fn connection(
    builder: Arc<auto::Builder<TokioExecutor>>,
    stream: TcpStream,
    shared: Arc<SimShared>,
    mut close: watch::Receiver<bool>,
) {
    // Each frame must reach the socket when it is written, not when Nagle decides.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| super::routes::handle(shared.clone(), req));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = close.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "sim: connection ended with an error");
    }
}
