//! SIGHUP: reload what can change without dropping a stream.
//!
//! The configuration is read again exactly as at start (the file, then flags and `METRONOME_*`
//! environment variables over it) and validated whole. An invalid file changes nothing: every
//! problem is logged and `metronome_config_reload_failures_total` counts the refusal. So does a
//! file that would take every route away or put the default upstream back to its built-in value
//! without writing so (an empty or cut-short file parses as all defaults). A valid one puts these
//! in force at once:
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

use crate::config::{Config, ConfigError, ConfigProblem, ServeArgs};

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
    let checked = Config::from_args_with_text(args).and_then(|(config, text)| {
        refuse_emptied(&state.live_config(), &config, text.as_deref(), args)?;
        Ok(config)
    });
    match checked {
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

/// Refuses a reload that would take every route away, or put the default upstream back to its
/// built-in value, when neither the file nor a flag says so: an empty or cut-short file is
/// valid TOML whose every section is the default, and applied it would send all traffic to
/// `http://127.0.0.1:8000` under route `other`. `routes = []` and a written `server.upstream`
/// say it on purpose.
fn refuse_emptied(
    old: &Config,
    new: &Config,
    text: Option<&str>,
    args: &ServeArgs,
) -> Result<(), ConfigError> {
    let writes = |key: &str| text.is_some_and(|text| crate::config_spans::writes(text, key));
    let mut problems = Vec::new();
    if !old.routes.is_empty() && new.routes.is_empty() && !writes("routes") {
        problems.push(ConfigProblem {
            key: "routes".into(),
            reason: format!(
                "the file names no routes, so the {} running ones would all go (an empty or \
                 cut-short file?); write `routes = []` to remove them on purpose",
                old.routes.len()
            ),
        });
    }
    let upstream_named = args.upstream.is_some() || writes("server.upstream");
    if new.server.upstream != old.server.upstream && !upstream_named {
        problems.push(ConfigProblem {
            key: "server.upstream".into(),
            reason: format!(
                "the file does not set it, so the default upstream would go from {} back to {} \
                 (an empty or cut-short file?); write it to change it",
                old.server.upstream, new.server.upstream
            ),
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError(problems))
    }
}

/// Applies a validated configuration: the reloadable parts at once, the rest only reported.
pub fn apply(state: &ProxyState, new: Config) -> Reloaded {
    let old = state.live_config();
    let mut done = Reloaded::default();
    describe_applied(&old, &new, &mut done.applied);
    describe_needs_restart(&old, &new, &mut done.needs_restart);

    let mut live = (*old).clone();
    live.server.upstream = new.server.upstream.clone();
    live.routes = new.routes.clone();
    live.metering.stall_threshold = new.metering.stall_threshold;
    live.readiness = new.readiness.clone();
    state
        .metrics
        .set_stall_threshold(live.metering.stall_threshold);
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

/// One sentence per change a reload applies at once: the default upstream, the routes, the
/// stall threshold and the readiness check.
fn describe_applied(old: &Config, new: &Config, applied: &mut Vec<String>) {
    if new.server.upstream != old.server.upstream {
        applied.push(format!(
            "server.upstream: {} -> {}",
            old.server.upstream, new.server.upstream
        ));
    }
    describe_routes(old, new, applied);
    if new.metering.stall_threshold != old.metering.stall_threshold {
        applied.push(format!(
            "metering.stall_threshold: {:?} -> {:?}",
            old.metering.stall_threshold, new.metering.stall_threshold
        ));
    }
    if new.readiness != old.readiness {
        applied.push(format!(
            "readiness: {:?} -> {:?}",
            old.readiness, new.readiness
        ));
    }
}

/// One sentence per changed key that only a restart applies: what the file now says and what
/// still runs.
fn describe_needs_restart(old: &Config, new: &Config, needs_restart: &mut Vec<String>) {
    let mut keys = server_keys(old, new);
    keys.extend(metering_keys(old, new));
    keys.extend(section_keys(old, new));
    for (key, was, wanted) in keys {
        if was != wanted {
            needs_restart.push(format!(
                "{key}: {wanted} in the file, still {was} until a restart"
            ));
        }
    }
}

/// A key only a restart applies, with its running value and the file's, as written in a
/// sentence.
type RestartKey = (&'static str, String, String);

/// `[server]` and `[timeouts]`: listeners, threads, clients, and the timeouts built into them.
fn server_keys(old: &Config, new: &Config) -> Vec<RestartKey> {
    let (was, wanted) = (&old.server, &new.server);
    let mut keys: Vec<RestartKey> = vec![
        (
            "server.listen",
            was.listen.to_string(),
            wanted.listen.to_string(),
        ),
        (
            "server.admin",
            was.admin.to_string(),
            wanted.admin.to_string(),
        ),
        (
            "server.threading",
            was.threading.name().into(),
            wanted.threading.name().into(),
        ),
        (
            "server.upstream_client",
            was.upstream_client.name().into(),
            wanted.upstream_client.name().into(),
        ),
        (
            "server.http1_server",
            was.http1_server.name().into(),
            wanted.http1_server.name().into(),
        ),
        (
            "server.workers",
            format!("{:?}", was.workers),
            format!("{:?}", wanted.workers),
        ),
    ];
    let (was_t, wanted_t) = (&old.timeouts, &new.timeouts);
    for (key, was, wanted) in [
        ("server.drain_grace", was.drain_grace, wanted.drain_grace),
        ("timeouts.connect", was_t.connect, wanted_t.connect),
        ("timeouts.first_byte", was_t.first_byte, wanted_t.first_byte),
        ("timeouts.idle", was_t.idle, wanted_t.idle),
        (
            "timeouts.upstream_idle",
            was_t.upstream_idle,
            wanted_t.upstream_idle,
        ),
    ] {
        keys.push((key, format!("{was:?}"), format!("{wanted:?}")));
    }
    keys
}

/// `[metering]`: what each stream's metering state is built with.
fn metering_keys(old: &Config, new: &Config) -> Vec<RestartKey> {
    let (was, wanted) = (&old.metering, &new.metering);
    let mut keys: Vec<RestartKey> = vec![(
        "metering.content_types",
        format!("{:?}", was.content_types),
        format!("{:?}", wanted.content_types),
    )];
    for (key, was, wanted) in [
        (
            "metering.max_event_bytes",
            was.max_event_bytes,
            wanted.max_event_bytes,
        ),
        (
            "metering.buffer_bytes",
            was.buffer_bytes,
            wanted.buffer_bytes,
        ),
        (
            "metering.buffer_frames",
            was.buffer_frames,
            wanted.buffer_frames,
        ),
        (
            "metering.max_usage_body_bytes",
            was.max_usage_body_bytes,
            wanted.max_usage_body_bytes,
        ),
    ] {
        keys.push((key, was.to_string(), wanted.to_string()));
    }
    keys.push((
        "metering.stream_id_header",
        format!("{:?}", was.stream_id_header),
        format!("{:?}", wanted.stream_id_header),
    ));
    keys
}

/// Whole sections only a restart applies: the model labels, the timeline ring, the admin
/// listener's bounds, the buckets.
fn section_keys(old: &Config, new: &Config) -> Vec<RestartKey> {
    let mut keys: Vec<RestartKey> = vec![
        (
            "models",
            format!("{:?}", old.models),
            format!("{:?}", new.models),
        ),
        (
            "timeline",
            format!("{:?}", old.timeline),
            format!("{:?}", new.timeline),
        ),
        (
            "admin",
            format!("{:?}", old.admin),
            format!("{:?}", new.admin),
        ),
    ];
    if new.buckets != old.buckets {
        keys.push((
            "buckets",
            "the start buckets".into(),
            "other buckets".into(),
        ));
    }
    keys
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key only a restart applies is named once, in the order of the file's sections,
    /// with the file's value and the running one.
    #[test]
    fn what_needs_a_restart_is_one_sentence_per_key() {
        let old = Config::from_toml("").unwrap();
        let new = Config::from_toml(
            r#"
[server]
listen = "127.0.0.1:9000"
http1_server = "hyper"
[timeouts]
connect = "7s"
[metering]
buffer_frames = 7
stream_id_header = "x-id"
[models]
max = 3
[buckets]
jank_ratio = [1, 2]
"#,
        )
        .unwrap();
        let mut said = Vec::new();
        describe_needs_restart(&old, &new, &mut said);
        let keys: Vec<&str> = said.iter().map(|s| s.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "server.listen",
                "server.http1_server",
                "timeouts.connect",
                "metering.buffer_frames",
                "metering.stream_id_header",
                "models",
                "buckets"
            ]
        );
        assert_eq!(
            said[1],
            "server.http1_server: hyper in the file, still native until a restart"
        );
        assert_eq!(
            said[3],
            "metering.buffer_frames: 7 in the file, still 1024 until a restart"
        );
        assert_eq!(
            said[6],
            "buckets: other buckets in the file, still the start buckets until a restart"
        );
    }
}
