//! (being written)
use std::process::ExitCode;
/// Arguments of `metronome serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {}
/// `metronome check-config FILE`.
pub fn check_config_command(_file: &std::path::Path) -> ExitCode { ExitCode::SUCCESS }
