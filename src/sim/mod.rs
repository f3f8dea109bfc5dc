//! `metronome sim`: a streaming inference server whose cadence you set. (Being written.)

use std::future::Future;
use std::process::ExitCode;

use tokio::net::TcpListener;

/// Command-line arguments of `metronome sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,
}

/// What the sim serves and at what cadence; built from [`SimArgs`] or in code (demo, tests).
#[derive(Debug, Clone, Default)]
pub struct SimConfig {}

/// Serves the sim on a bound listener until `shutdown` resolves.
pub async fn serve(
    _listener: TcpListener,
    _config: SimConfig,
    _shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    Ok(())
}

/// Entry point of the `sim` subcommand.
pub async fn run(_args: SimArgs) -> ExitCode {
    ExitCode::SUCCESS
}
