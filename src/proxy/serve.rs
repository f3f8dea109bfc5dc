//! `metronome serve`: the configuration read, the runtime built, the signal handlers installed,
//! and the proxy served until SIGTERM (SIGHUP reloads), as a thin binary calls it.

use std::process::ExitCode;

use super::{reload, ProxyHandle};
use crate::config::{Config, ServeArgs, Threading};

/// Entry point of `metronome serve`: reads the configuration, then starts the event loop that
/// runs everything but the proxy listener's workers (signals, reloads, the admin listener) and,
/// under `threading = "shared"`, the proxy listener too.
pub fn main(args: ServeArgs) -> ExitCode {
    let config = match Config::from_args(&args) {
        Ok(config) => config,
        Err(crate::config::ConfigError(problems)) => {
            eprintln!("error: the configuration is invalid:");
            for p in problems {
                eprintln!("  {p}");
            }
            return ExitCode::from(2);
        }
    };
    let runtime = match config.server.threading {
        // The workers have event loops of their own; this one only answers the admin listener.
        Threading::PerCore => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Threading::Shared => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads())
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(runtime) => runtime.block_on(serve(config, args)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the listeners of `config` with the signal handlers already in place, then [`run`]s.
async fn serve(config: Config, args: ServeArgs) -> ExitCode {
    // Signal handlers go in before the listeners answer: a SIGTERM or SIGHUP that comes right
    // after start must drain or reload, not kill the process with the default action.
    let terminated = termination();
    #[cfg(unix)]
    let _hangup_handler =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let handle = match ProxyHandle::start(config).await {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("error: cannot start listening: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        proxy = %handle.proxy_addr,
        admin = %handle.admin_addr,
        upstream = %handle.state.config.server.upstream,
        threading = handle.state.config.server.threading.name(),
        workers = handle.state.config.worker_threads(),
        "metronome serving"
    );
    run(handle, &args, terminated).await;
    ExitCode::SUCCESS
}

/// Serves on a started proxy, reloading on SIGHUP, until `shutdown` resolves; then drains.
pub async fn run(
    handle: ProxyHandle,
    args: &ServeArgs,
    shutdown: impl std::future::Future<Output = ()>,
) {
    reload::reload_on_sighup(&handle.state, args, shutdown).await;
    tracing::info!(
        grace = ?handle.state.config.server.drain_grace,
        "draining in-flight streams"
    );
    handle.shutdown().await;
    tracing::info!("stopped");
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn wait_for_termination() {
    termination().await
}

/// Registers for SIGTERM at once (so a signal that comes before the returned future is first
/// polled is not lost, nor does it kill the process) and resolves on SIGTERM or Ctrl-C.
pub fn termination() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
