//! Batch-wide stalls: tell a hitch that hit the whole batch of an engine ("someone
//! else hit submit": a long prompt's prefill inside the shared forward pass) from one that hit
//! a single stream, and name the requests that arrived just before.
//!
//! - [`chance`]: whether a co-stall is too unlikely for independent stalls (the episode rule).
//! - [`hitch`]: the per-stream rule (is this gap a hitch?), per frame, no allocation.
//! - [`tracker`]: the per-upstream episode tracker, pure (time passed in), O(active streams)
//!   plus bounded rings.
//! - [`live`]: the glue to the proxy: one tracker per upstream behind a lock taken per hitch and
//!   per stream start and end (never per frame), a sweep task per upstream while it has
//!   streams, the metrics, and the episodes `/episodes` shows.
//! - [`silent`]: the tracker's ordered list of streams silent past their threshold.
//! - [`json`]: the JSON of `/episodes`.
//!
//! The definitions are in docs/batch.md ("Is it my stream or the batch?").

pub mod chance;
pub mod hitch;
pub mod json;
pub mod live;
pub mod silent;
pub mod tracker;

pub use live::{BatchDetector, HitchMark, StreamProbe};
pub use tracker::{Episode, Scope};

pub use crate::config::BatchSettings;
