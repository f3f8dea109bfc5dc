//! `metronome sim`: a streaming server in the shapes of the APIs metronome reads (OpenAI chat and
//! completions, TGI, Anthropic, the Responses API, Ollama, Gemini) whose cadence and phases you
//! set, so the proxy and the probe can be tested against a known truth.
//!
//! Module map, in the order a request meets them:
//!
//! - [`args`] and [`config`]: the command line and the plain [`SimConfig`] it becomes.
//! - `server`: the accept loop, one task per connection, graceful shutdown.
//! - `routes` and `request`: which path does what; what is read from a request body.
//! - `phases`: what a stream outputs: reasoning, the answer and tool calls, token by token.
//! - `cadence`: when each decode step happens and how many tokens it yields (seeded).
//! - `batch`: `--engine batch`, one decode loop for the whole server whose prefills hold
//!   every stream's step.
//! - `stream`: the response body that writes steps into frames on that schedule, coalescing and
//!   buffering as configured.
//! - `shapes`: the wire formats, one module per API.
//! - [`replay`]: `--replay`, a captured `/streams/{id}` timeline played back frame for frame.
//! - [`stats`] and `timeline`: what was served, live (counters) and exactly (frame send times).
//! - `websocket`: `GET /v1/responses` and `GET /v1/realtime` upgraded: the Responses API's
//!   WebSocket mode and the Realtime API, their responses driven by the same streams.

pub mod args;
mod batch;
mod cadence;
pub mod config;
mod phases;
pub mod replay;
mod request;
mod routes;
mod server;
mod shapes;
pub mod stats;
mod stream;
mod timeline;
mod websocket;

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use args::{CadenceArgs, Deflate, PhaseArgs, SimArgs, WebSocketArgs};
pub use config::{
    CloseSpec, ConfigError, Engine, ReasoningField, ResponsesReasoning, SimConfig, ThinkTags,
    UsageMode, WebSocketConfig,
};
pub use routes::STREAM_HEADER;
pub use server::serve_with_stats;
pub use stats::{SimStats, SimStatsSnapshot};

/// Serves the sim on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: SimConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_with_stats(listener, config, Arc::new(SimStats::default()), shutdown).await
}

/// A sim running in the background of the current runtime: for the demo and for tests, which
/// need its address, its counters and a way to stop it.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    stats: Arc<SimStats>,
    /// Dropping or sending stops the server.
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Starts the sim on `listener` in a background task (call from within a tokio runtime).
/// Dropping the handle shuts the server down.
pub fn spawn(listener: TcpListener, config: SimConfig) -> std::io::Result<SimHandle> {
    let addr = listener.local_addr()?;
    let stats = Arc::new(SimStats::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with_stats(listener, config, stats.clone(), async {
        let _ = stopped.await;
    }));
    Ok(SimHandle {
        addr,
        stats,
        stop: Some(stop),
        task: Some(task),
    })
}

// === impl SimHandle ===

impl SimHandle {
    /// The address the sim listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base URL of the sim.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The sim's live counters.
    pub fn stats(&self) -> &Arc<SimStats> {
        &self.stats
    }

    /// Stops accepting, lets streams in flight finish (within the drain time) and waits.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

/// Entry point of the `sim` subcommand: exit 0 after Ctrl-C or SIGTERM, 2 for a bad flag.
pub async fn run(args: SimArgs) -> ExitCode {
    let config = match SimConfig::try_from(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host(&args.listen).await {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            eprintln!("error: --listen `{}` is not an address: {e}", args.listen);
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(addrs.as_slice()).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {} (--listen): {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("error: the listener has no address: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%addr, "metronome sim listening");
    println!("metronome sim listening on http://{addr}");
    if let Some(replay) = &config.replay {
        println!("{}", replay.describe());
    }
    match serve(listener, config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
