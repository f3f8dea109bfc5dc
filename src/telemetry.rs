//! Logging setup shared by every subcommand.

/// Installs the `tracing` subscriber: human-readable lines on stderr, filtered by `RUST_LOG`
/// (default `info`). Called once, by the binary.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
