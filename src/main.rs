//! The `metronome` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// What `--version` prints: the crate's version and the commit it was built from (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("METRONOME_BUILD_COMMIT"),
    ")"
);

/// metronome: makes the stutter of streamed LLM output visible.
#[derive(Parser, Debug)]
#[command(name = "metronome", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: metronome::logging::LogArgs,
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
    metronome::logging::init(&cli.log);
    match cli.command {
        // `serve` chooses its threads from its configuration.
        Command::Serve(args) => metronome::proxy::serve::main(args),
        Command::CheckConfig { file } => metronome::config::check_config_command(&file),
        Command::Sim(args) => block_on(metronome::sim::run(args)),
        Command::Probe(args) => block_on(metronome::probe::run(args)),
        Command::Demo(args) => block_on(metronome::demo::run(args)),
    }
}

/// Runs a command on tokio's multi-threaded runtime.
fn block_on(command: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(command),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
