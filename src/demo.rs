//! (being written)
use std::process::ExitCode;
/// Arguments of `metronome demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {}
/// Entry point of `metronome demo`.
pub async fn run(_args: DemoArgs) -> ExitCode {
    ExitCode::SUCCESS
}
