//! The integration tests that can share a process, linked as one test binary: each file here was
//! a binary of its own, and each link of the whole crate and its dependencies took longer than
//! most of the tests it ran. Run one file's tests with `cargo test --test it labels::`.
//!
//! The tests that need the process to themselves stay binaries of their own in tests/: those
//! with a counting global allocator (allocations, batch_memory), those that count the process's
//! resident set, descriptors or threads (memory, hostile_clients, otlp_limits), the one that
//! installs the global log subscriber (hostile_upstreams), and reload and signals.

#[path = "../support/mod.rs"]
mod support;

mod access_log;
mod admin;
mod backpressure;
mod batch;
mod batch_chance;
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
mod phases;
mod probe;
mod probe_ci;
mod probe_cli;
mod probe_reports;
mod proxy;
mod replay;
mod response_usage;
mod serve_messages;
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
