//! `metronome probe`: streams requests and measures the gap distribution at the client. (Being written.)

use std::process::ExitCode;

/// Command-line arguments of `metronome probe`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProbeArgs {
    /// URL to stream from.
    #[arg(long)]
    pub url: String,
}

/// Entry point of the `probe` subcommand.
pub async fn run(_args: ProbeArgs) -> ExitCode {
    ExitCode::SUCCESS
}
