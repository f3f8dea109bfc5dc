//! SIGHUP: reload what can change without dropping a stream.
//!
//! The configuration is read again exactly as at start (the file, then flags and `METRONOME_*`
//! environment variables over it) and validated whole. An invalid file changes nothing: every
//! problem is logged and `metronome_config_reload_failures_total` counts the refusal. A valid one
//! puts these in force at once:
//!
//! - routes, their upstreams and `server.upstream`: each request takes the routing table once, so
//!   new requests follow the new table while a stream in flight keeps its route and connection;
//! - `metering.stall_threshold`: gaps measured from then on are compared with it (later gaps of a
//!   stream in flight too; stalls already counted stay counted);
//! - the `[readiness]` table: the next upstream check uses it.
//!
//! Everything else is fixed at start: listener addresses (the sockets are bound), the threads, the drain grace,
//! timeouts and metering bounds (read by code that holds the start configuration), the stream ID
//! header, the `model` label bounds, the `[timeline]` bounds (the ring is allocated at start) and
//! the buckets (a histogram's buckets cannot change under its series). A reload that changes them logs each one and keeps the running value.

use std::future::Future;

use crate::config::{Config, ConfigError, ServeArgs};

use super::ProxyState;

/// What one reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Changes now in force, one sentence each.
    pub applied: Vec<String>,
    /// Changes in the file that need a restart, one sentence each; the running values stayed.
    pub needs_restart: Vec<String>,
}

/// Re-reads the configuration the way `serve` read it at start and applies it; on an invalid
/// file logs every problem, counts the failure and keeps the running configuration.
pub fn reload(state: &ProxyState, args: &ServeArgs) -> Result<Reloaded, ConfigError> {
    match Config::from_args(args) {
        Ok(config) => Ok(apply(state, config)),
        Err(error) => {
            state.metrics.config_reload_failures.inc();
            let file = args
                .config
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(no file)".into());
            tracing::error!(
                %file,
                problems = error.0.len(),
                "reload refused: the configuration is invalid; the running one stays"
            );
            for problem in &error.0 {
                tracing::error!(%file, key = %problem.key, reason = %problem.reason, "reload problem");
            }
            Err(error)
        }
    }
}

/// Applies a validated configuration: the reloadable parts at once, the rest only reported.
pub fn apply(state: &ProxyState, new: Config) -> Reloaded {
    let old = state.live_config();
    let mut done = Reloaded::default();

    let mut live = (*old).clone();
    if new.upstream != old.upstream {
        done.applied.push(format!(
            "server.upstream: {} -> {}",
            old.upstream, new.upstream
        ));
    }
    describe_routes(&old, &new, &mut done.applied);
    if new.stall_threshold != old.stall_threshold {
        done.applied.push(format!(
            "metering.stall_threshold: {:?} -> {:?}",
            old.stall_threshold, new.stall_threshold
        ));
    }
    if new.readiness != old.readiness {
        done.applied.push(format!(
            "readiness: {:?} -> {:?}",
            old.readiness, new.readiness
        ));
    }
    live.upstream = new.upstream.clone();
    live.routes = new.routes.clone();
    live.stall_threshold = new.stall_threshold;
    live.readiness = new.readiness.clone();

    let mut fixed = |key: &str, changed: bool, was: String, wanted: String| {
        if changed {
            done.needs_restart.push(format!(
                "{key}: {wanted} in the file, still {was} until a restart"
            ));
        }
    };
    fixed(
        "server.listen",
        new.listen != old.listen,
        old.listen.to_string(),
        new.listen.to_string(),
    );
    fixed(
        "server.admin",
        new.admin != old.admin,
        old.admin.to_string(),
        new.admin.to_string(),
    );
    fixed(
        "server.threading",
        new.threading != old.threading,
        old.threading.name().into(),
        new.threading.name().into(),
    );
    fixed(
        "server.upstream_client",
        new.upstream_client != old.upstream_client,
        old.upstream_client.name().into(),
        new.upstream_client.name().into(),
    );
    fixed(
        "server.http1_server",
        new.http1_server != old.http1_server,
        old.http1_server.name().into(),
        new.http1_server.name().into(),
    );
    fixed(
        "server.workers",
        new.workers != old.workers,
        format!("{:?}", old.workers),
        format!("{:?}", new.workers),
    );
    for (key, was, wanted) in [
        ("server.drain_grace", old.drain_grace, new.drain_grace),
        ("timeouts.connect", old.connect_timeout, new.connect_timeout),
        (
            "timeouts.first_byte",
            old.first_byte_timeout,
            new.first_byte_timeout,
        ),
        ("timeouts.idle", old.idle_timeout, new.idle_timeout),
        (
            "timeouts.upstream_idle",
            old.upstream_idle_timeout,
            new.upstream_idle_timeout,
        ),
    ] {
        fixed(
            key,
            was != wanted,
            format!("{was:?}"),
            format!("{wanted:?}"),
        );
    }
    fixed(
        "metering.content_types",
        new.stream_content_types != old.stream_content_types,
        format!("{:?}", old.stream_content_types),
        format!("{:?}", new.stream_content_types),
    );
    for (key, was, wanted) in [
        (
            "metering.max_event_bytes",
            old.max_event_bytes,
            new.max_event_bytes,
        ),
        ("metering.buffer_bytes", old.buffer_bytes, new.buffer_bytes),
        (
            "metering.buffer_frames",
            old.buffer_frames,
            new.buffer_frames,
        ),
    ] {
        fixed(key, was != wanted, was.to_string(), wanted.to_string());
    }
    fixed(
        "metering.stream_id_header",
        new.stream_id_header != old.stream_id_header,
        format!("{:?}", old.stream_id_header),
        format!("{:?}", new.stream_id_header),
    );
    fixed(
        "models",
        new.models != old.models,
        format!("{:?}", old.models),
        format!("{:?}", new.models),
    );
    fixed(
        "timeline",
        new.timeline != old.timeline,
        format!("{:?}", old.timeline),
        format!("{:?}", new.timeline),
    );
    fixed(
        "buckets",
        new.buckets != old.buckets,
        "the start buckets".into(),
        "other buckets".into(),
    );

    state.metrics.set_stall_threshold(live.stall_threshold);
    state.set_live(std::sync::Arc::new(live));

    if done.applied.is_empty() && done.needs_restart.is_empty() {
        tracing::info!("configuration reloaded: nothing changed");
    }
    for change in &done.applied {
        tracing::info!(%change, "configuration reloaded");
    }
    for change in &done.needs_restart {
        tracing::warn!(%change, "reload cannot change this; restart to apply it");
    }
    done
}

/// One sentence per route added, removed or changed, or one for a new order.
fn describe_routes(old: &Config, new: &Config, out: &mut Vec<String>) {
    let show = |r: &crate::config::RouteConfig| {
        format!(
            "{} {:?} {} -> {}",
            r.method.as_ref().map(|m| m.as_str()).unwrap_or("*"),
            r.match_kind,
            r.path,
            r.upstream
        )
    };
    let before = out.len();
    for r in &new.routes {
        match old.routes.iter().find(|o| o.name == r.name) {
            None => out.push(format!("route `{}` added: {}", r.name, show(r))),
            Some(o) if o != r => out.push(format!(
                "route `{}` changed: {} => {}",
                r.name,
                show(o),
                show(r)
            )),
            Some(_) => {}
        }
    }
    for o in &old.routes {
        if !new.routes.iter().any(|r| r.name == o.name) {
            out.push(format!("route `{}` removed", o.name));
        }
    }
    if out.len() == before && old.routes != new.routes {
        out.push("routes reordered (they are tried in file order)".into());
    }
}

/// Reloads on every SIGHUP until `until` resolves (SIGTERM).
pub async fn reload_on_sighup(
    state: &ProxyState,
    args: &ServeArgs,
    until: impl Future<Output = ()>,
) {
    tokio::pin!(until);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => loop {
                tokio::select! {
                    _ = &mut until => return,
                    received = hangup.recv() => match received {
                        Some(()) => {
                            tracing::info!("SIGHUP: reloading the configuration");
                            let _ = reload(state, args);
                            match state.reload_tls() {
                                Ok(true) => tracing::info!("SIGHUP: reloaded the listener's certificate"),
                                Ok(false) => {}
                                Err(e) => tracing::error!(error = %e, "SIGHUP: the new certificate failed to load; keeping the old one"),
                            }
                        }
                        None => break,
                    },
                }
            },
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP; reload is off"),
        }
    }
    until.await;
}
