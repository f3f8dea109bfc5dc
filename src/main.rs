//! The `metronome` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// metronome: makes the stutter of streamed LLM output visible.
#[derive(Parser, Debug)]
#[command(name = "metronome", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the metering proxy.
    Serve(metronome::config::ServeArgs),
    /// Validate a configuration file and explain every problem (exit 0 or 2).
    CheckConfig {
        /// The TOML file to check.
        file: std::path::PathBuf,
    },
    /// Run a streaming inference server whose cadence you set.
    Sim(metronome::sim::SimArgs),
    /// Stream requests and measure the gap distribution at the client.
    Probe(metronome::probe::ProbeArgs),
    /// Sim, proxy and probe together on loopback, with a report.
    Demo(metronome::demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    metronome::telemetry::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => metronome::proxy::run(args).await,
            Command::CheckConfig { file } => metronome::config::check_config_command(&file),
            Command::Sim(args) => metronome::sim::run(args).await,
            Command::Probe(args) => metronome::probe::run(args).await,
            Command::Demo(args) => metronome::demo::run(args).await,
        }
    })
}
