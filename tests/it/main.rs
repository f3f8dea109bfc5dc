//! The integration tests that can share a process, linked as one test binary: each file here was
//! a binary of its own, and linking the crate and its dependencies into each took longer than
//! most of them run. One file's tests: `cargo test --test it labels::`.
//!
//! A file joins only if nothing it asserts reads or changes state of the whole process. The
//! files that do stay binaries of their own in tests/: a counting global allocator
//! (allocations.rs, batch_memory.rs); the process's resident set (memory.rs), descriptors and CPU
//! time (hostile_clients.rs) or threads (otlp_limits.rs), which tests running beside them would
//! change; the global log subscriber, set once, whose captured lines any proxy of the process
//! would write into (hostile_upstreams.rs). The panic hook of faults.rs is process-wide too, but
//! it counts only panics located outside tests/, which no test here provokes on purpose (the
//! injected panic of panics.rs is located in tests/). signals.rs signals only its child's pid,
//! and reload.rs reloads only its own proxy's state.
//!
//! Six files stay apart for time, not state: their assertions on gaps, hitches and episodes
//! (batch.rs, batch_chance.rs, phases.rs, probe.rs, probe_ci.rs, proxy.rs) need the sim and the
//! proxy to keep their cadence, and run beside the heavier tests of this binary under a loaded
//! machine they failed where their own binaries, running only their own tests two at a time,
//! passed.

#[path = "../support/mod.rs"]
mod support;

mod access_log;
mod admin;
mod backpressure;
mod batch_exemplars;
mod beacon_js;
mod cli;
mod counters;
mod docs;
mod exposition;
mod faults;
mod finish_reason;
mod formats;
mod http1_server;
mod join;
mod labels;
mod layers;
mod live;
mod logging;
mod otlp_episodes;
mod panics;
mod probe_cli;
mod probe_reports;
mod reload;
mod replay;
mod response_usage;
mod serve_messages;
mod signals;
mod sim;
mod sim_phases;
mod slo;
mod streams_query;
mod timelines;
mod tls;
mod trace_context;
mod transparency;
mod upstream_client;
mod websocket_tools;
mod websocket_tunnel;
