//! The per-frame core: what runs for every frame a metered stream forwards, below the proxy that
//! drives it.
//!
//! - [`meter`]: the work at ingress: scan, classify, update the ledger.
//! - [`ledger`]: fixed-size per-stream state, recorded exactly once at the end of a stream.
//! - [`clock`]: the monotonic stamps every frame gets at ingress and egress.
//! - [`usage`]: the usage figures an upstream reports, believed only when plausible.
//! - [`response_usage`]: a non-streaming response's usage, added to the token counters (off the
//!   frame path: once, when its body has ended).
//! - [`backpressure`]: the intervals a stream is held back by its client, and their marks.
//!
//! The gap sketch (`crate::sketch`) and the cache hints (`crate::prefetch`) are per-frame work too
//! but stay leaves at the crate root: the token formats, the histograms and the timelines use
//! them, and those sit below this module.
//!
//! Architecture Invariant: nothing here depends on the proxy, the admin listener or an exporter;
//! they depend on this.

pub mod backpressure;
pub mod clock;
pub mod ledger;
pub mod meter;
pub mod response_usage;
pub mod usage;
