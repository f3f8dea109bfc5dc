//! Validation: the file as written ([`RawConfig`]) checked section by section into a [`Config`].
//!
//! One function per TOML section, each given the section and a `problem` sink: it reports every
//! problem under its dotted key and returns its part of the configuration, or `None` when a value
//! it needs is wrong (the problems fail the configuration anyway). [`validate`] then puts the
//! parts together, so every problem of a file comes in one run.

use super::*;
use crate::format::{ThinkSettings, ThinkStart, ThinkTags};
use std::sync::Arc;

/// Where a validator reports a problem: the dotted key and what is wrong.
type Problem<'a> = dyn FnMut(&str, String) + 'a;

/// A socket address (`0.0.0.0:8080`, `[::1]:9464`) or a host name and port (`localhost:9464`,
/// resolved once, IPv4 first), or a problem under `key`.
fn address(key: &str, text: &str, problem: &mut Problem<'_>) -> Option<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr);
    }
    let host_and_port = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !host_and_port {
        problem(
            key,
            format!("`{text}` is not an address like 0.0.0.0:8080 or localhost:9464"),
        );
        return None;
    }
    match std::net::ToSocketAddrs::to_socket_addrs(text) {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            let first = addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied();
            if first.is_none() {
                problem(key, format!("`{text}` resolves to no address"));
            }
            first
        }
        Err(e) => {
            problem(key, format!("cannot resolve `{text}`: {e}"));
            None
        }
    }
}

/// A duration longer than zero and at most a year, or a problem under `key`.
fn timeout(key: &str, text: &str, problem: &mut Problem<'_>) -> Option<Duration> {
    parse_duration(text)
        .and_then(|d| {
            if d.is_zero() {
                Err("must be longer than zero".to_string())
            } else if d > MAX_DURATION {
                // Deadlines are `now + duration`: an absurd one would overflow the clock.
                Err(format!("`{text}` is longer than a year"))
            } else {
                Ok(d)
            }
        })
        .map_err(|e| problem(key, e))
        .ok()
}

fn server(raw: &RawServer, problem: &mut Problem<'_>) -> Option<ServerConfig> {
    let listen = address("server.listen", &raw.listen, problem);
    let admin = address("server.admin", &raw.admin, problem);
    let upstream = Upstream::parse(&raw.upstream)
        .map_err(|e| problem("server.upstream", e))
        .ok();
    let drain_grace = timeout("server.drain_grace", &raw.drain_grace, problem);
    let threading = Threading::parse(&raw.threading)
        .map_err(|e| problem("server.threading", e))
        .ok();
    let upstream_client = crate::config::ClientKind::parse(&raw.upstream_client)
        .map_err(|e| problem("server.upstream_client", e))
        .ok();
    let http1_server = crate::config::ServerKind::parse(&raw.http1_server)
        .map_err(|e| problem("server.http1_server", e))
        .ok();
    if raw.workers > MAX_WORKERS {
        problem(
            "server.workers",
            format!(
                "{} is more than {MAX_WORKERS}; 0 means one per CPU",
                raw.workers
            ),
        );
    }
    if let (Some(l), Some(a)) = (listen, admin) {
        if l == a && l.port() != 0 {
            problem(
                "server.admin",
                format!("must differ from server.listen (both are {l})"),
            );
        }
    }
    Some(ServerConfig {
        listen: listen?,
        admin: admin?,
        upstream: upstream?,
        drain_grace: drain_grace?,
        threading: threading?,
        upstream_client: upstream_client?,
        http1_server: http1_server?,
        workers: usize::try_from(raw.workers)
            .ok()
            .and_then(std::num::NonZeroUsize::new),
    })
}

fn timeouts(raw: &RawTimeouts, problem: &mut Problem<'_>) -> Option<TimeoutsConfig> {
    let connect = timeout("timeouts.connect", &raw.connect, problem);
    let first_byte = timeout("timeouts.first_byte", &raw.first_byte, problem);
    let idle = timeout("timeouts.idle", &raw.idle, problem);
    let tls_handshake = timeout("timeouts.tls_handshake", &raw.tls_handshake, problem);
    let client_idle = timeout("timeouts.client_idle", &raw.client_idle, problem);
    let client_head = timeout("timeouts.client_head", &raw.client_head, problem);
    let upstream_idle = timeout("timeouts.upstream_idle", &raw.upstream_idle, problem);
    let sniff = timeout("timeouts.sniff", &raw.sniff, problem);
    let websocket_idle = timeout("timeouts.websocket_idle", &raw.websocket_idle, problem);
    Some(TimeoutsConfig {
        connect: connect?,
        first_byte: first_byte?,
        idle: idle?,
        tls_handshake: tls_handshake?,
        client_idle: client_idle?,
        client_head: client_head?,
        upstream_idle: upstream_idle?,
        sniff: sniff?,
        websocket_idle: websocket_idle?,
    })
}

fn metering(m: &RawMetering, problem: &mut Problem<'_>) -> Option<MeteringConfig> {
    let stall_threshold = timeout("metering.stall_threshold", &m.stall_threshold, problem);
    if m.content_types.is_empty() {
        problem(
            "metering.content_types",
            "must list at least one content type (otherwise nothing is metered)".into(),
        );
    }
    for (i, ct) in m.content_types.iter().enumerate() {
        if ct.parse::<mime_like::Essence>().is_err() {
            problem(
                &format!("metering.content_types[{i}]"),
                format!("`{ct}` is not a content type like text/event-stream"),
            );
        }
    }
    for (key, value, low, high) in [
        (
            "metering.max_event_bytes",
            m.max_event_bytes,
            256,
            16 * 1024 * 1024,
        ),
        (
            "metering.buffer_bytes",
            m.buffer_bytes,
            1024,
            256 * 1024 * 1024,
        ),
        ("metering.buffer_frames", m.buffer_frames, 1, 1 << 20),
        (
            "metering.max_usage_body_bytes",
            m.max_usage_body_bytes,
            0,
            64 * 1024 * 1024,
        ),
    ] {
        if !(low..=high).contains(&value) {
            problem(key, format!("{value} is out of range ({low} to {high})"));
        }
    }
    let stream_id_header = if m.stream_id_header.is_empty() {
        Some(None)
    } else {
        http::HeaderName::from_bytes(m.stream_id_header.as_bytes())
            .map_err(|_| {
                problem(
                    "metering.stream_id_header",
                    format!("`{}` is not a valid header name", m.stream_id_header),
                )
            })
            .ok()
            .map(Some)
    };
    Some(MeteringConfig {
        enabled: m.enabled,
        content_types: m
            .content_types
            .iter()
            .map(|c| c.trim().to_ascii_lowercase())
            .collect(),
        stall_threshold: stall_threshold?,
        max_event_bytes: m.max_event_bytes,
        buffer_bytes: m.buffer_bytes,
        buffer_frames: m.buffer_frames,
        stream_id_header: stream_id_header?,
        max_usage_body_bytes: m.max_usage_body_bytes,
    })
}

fn readiness(raw: &RawReadiness, problem: &mut Problem<'_>) -> Option<ReadinessConfig> {
    let interval = timeout("readiness.interval", &raw.interval, problem);
    let timeout = timeout("readiness.timeout", &raw.timeout, problem);
    if let (Some(interval), Some(timeout)) = (interval, timeout) {
        if timeout > interval {
            problem(
                "readiness.timeout",
                format!(
                    "`{}` is longer than readiness.interval (`{}`): checks would overlap",
                    raw.timeout, raw.interval
                ),
            );
        }
    }
    let path = match raw.path.as_str() {
        "" => Some(None),
        path if !path.starts_with('/') => {
            problem(
                "readiness.path",
                format!("`{path}` must start with / (or be empty for a TCP check)"),
            );
            None
        }
        path => match path.parse::<http::uri::PathAndQuery>() {
            Ok(p) => Some(Some(p)),
            Err(_) => {
                problem(
                    "readiness.path",
                    format!("`{path}` is not a valid request path"),
                );
                None
            }
        },
    };
    Some(ReadinessConfig {
        check_upstream: raw.check_upstream,
        path: path?,
        interval: interval?,
        timeout: timeout?,
    })
}

fn models(raw: &ModelsConfig, problem: &mut Problem<'_>) {
    for (i, name) in raw.allow.iter().enumerate() {
        if let Some(why) = crate::metrics::models::refusal(name) {
            problem(
                &format!("models.allow[{i}]"),
                format!("`{}` {why}", name.escape_debug()),
            );
        }
    }
    if raw.max == 0 && raw.allow.is_empty() {
        problem(
            "models.max",
            "must be at least 1 unless models.allow lists the models".into(),
        );
    }
    if raw.max > 1000 {
        problem(
            "models.max",
            format!(
                "{} would let streams create too many series (at most 1000)",
                raw.max
            ),
        );
    }
}

/// `[tls]`: `None` when the listener is plain (or the pair is wrong, reported).
fn tls(raw: &RawTls, problem: &mut Problem<'_>) -> Option<ListenerTls> {
    match (raw.cert.as_str(), raw.key.as_str()) {
        ("", "") => None,
        ("", _) => {
            problem("tls.cert", "is needed with tls.key".into());
            None
        }
        (_, "") => {
            problem("tls.key", "is needed with tls.cert".into());
            None
        }
        (cert, key) => match crate::tls::certified_key(Path::new(cert), Path::new(key)) {
            Ok(_) => Some(ListenerTls {
                cert: cert.into(),
                key: key.into(),
            }),
            Err(e) => {
                problem("tls.cert", format!("cannot be used with tls.key: {e}"));
                None
            }
        },
    }
}

fn upstream_tls(ut: &RawUpstreamTls, problem: &mut Problem<'_>) -> UpstreamTls {
    let mut upstream_tls = UpstreamTls::default();
    if !ut.ca.is_empty() {
        match crate::tls::load_certs(Path::new(&ut.ca)) {
            Ok(_) => upstream_tls.ca = Some(ut.ca.clone().into()),
            Err(e) => problem("upstream_tls.ca", e.to_string()),
        }
    }
    match (ut.client_cert.as_str(), ut.client_key.as_str()) {
        ("", "") => {}
        ("", _) | (_, "") => problem(
            "upstream_tls.client_cert",
            "client_cert and client_key go together".into(),
        ),
        (cert, key) => {
            match crate::tls::client_config(None, Some((Path::new(cert), Path::new(key)))) {
                Ok(_) => upstream_tls.client_cert = Some((cert.into(), key.into())),
                Err(e) => problem("upstream_tls.client_cert", e.to_string()),
            }
        }
    }
    upstream_tls
}

/// `[admin]`: the admin listener's connection limit, timeouts and head bound.
fn admin(raw: &RawAdmin, problem: &mut Problem<'_>) -> Option<AdminConfig> {
    let head_timeout = timeout("admin.head_timeout", &raw.head_timeout, problem);
    let idle_timeout = timeout("admin.idle_timeout", &raw.idle_timeout, problem);
    for (key, value, low, high) in [
        ("admin.max_connections", raw.max_connections, 1, 65_536),
        // hyper's HTTP/1 server reads into a buffer of at least 8 KiB.
        (
            "admin.max_header_bytes",
            raw.max_header_bytes,
            8192,
            1024 * 1024,
        ),
    ] {
        if !(low..=high).contains(&value) {
            problem(key, format!("{value} is out of range ({low} to {high})"));
        }
    }
    Some(AdminConfig {
        max_connections: raw.max_connections,
        head_timeout: head_timeout?,
        idle_timeout: idle_timeout?,
        max_header_bytes: raw.max_header_bytes,
    })
}

fn limits(l: &LimitsConfig, problem: &mut Problem<'_>) {
    for (key, value, min) in [
        ("limits.max_connections", l.max_connections as u64, 1),
        ("limits.max_requests", l.max_requests as u64, 1),
        ("limits.max_header_bytes", l.max_header_bytes as u64, 8192),
        ("limits.max_request_body_bytes", l.max_request_body_bytes, 1),
    ] {
        if value < min {
            problem(key, format!("{value} is too small (at least {min})"));
        }
    }
}

fn timeline(t: &TimelineConfig, problem: &mut Problem<'_>) {
    if t.max_streams > 100_000 {
        problem(
            "timeline.max_streams",
            format!("{} is out of range (0 to 100000)", t.max_streams),
        );
    }
    if t.max_frames > 1 << 20 {
        problem(
            "timeline.max_frames",
            format!("{} is out of range (0 to 1048576)", t.max_frames),
        );
    }
    if !t.beacon_path.is_empty() && !t.beacon_path.starts_with('/') {
        problem(
            "timeline.beacon_path",
            format!(
                "`{}` must start with / (or be empty to turn beacons off)",
                t.beacon_path
            ),
        );
    }
    if t.beacon_max_bytes < 256 || t.beacon_max_bytes > 1024 * 1024 {
        problem(
            "timeline.beacon_max_bytes",
            format!("{} is out of range (256 to 1048576)", t.beacon_max_bytes),
        );
    }
}

/// `[buckets]` and `[metrics]`: the flush interval (`None` inside: only at each stream's end).
fn metrics(
    b: &Buckets,
    metrics: &MetricsConfig,
    problem: &mut Problem<'_>,
) -> Option<Option<Duration>> {
    for (key, bounds) in [
        ("buckets.ttft", &b.ttft),
        ("buckets.itl", &b.itl),
        ("buckets.proxy_delay", &b.proxy_delay),
        ("buckets.stall_duration", &b.stall_duration),
        ("buckets.jank_ratio", &b.jank_ratio),
        ("buckets.tokens_per_event", &b.tokens_per_event),
        ("buckets.events_per_frame", &b.events_per_frame),
    ] {
        if let Err(reason) = check_bounds(bounds) {
            problem(key, reason);
        }
    }
    for (key, reason) in metrics.native.problems() {
        problem(key, reason);
    }
    match parse_duration(&metrics.flush_interval) {
        Ok(d) if d.is_zero() => Some(None),
        Ok(d) if d <= MAX_FLUSH_INTERVAL => Some(Some(d)),
        Ok(_) => {
            problem(
                "metrics.flush_interval",
                format!(
                    "`{}` is longer than an hour (0s flushes only at each stream's end)",
                    metrics.flush_interval
                ),
            );
            None
        }
        Err(e) => {
            problem("metrics.flush_interval", e);
            None
        }
    }
}

/// `[[routes]]`: the routes whose every value is right, in order (`upstream` is the default
/// upstream of a route without its own; `None` when `[server]` is wrong, which fails the
/// configuration anyway).
fn routes(
    raw: &[RawRoute],
    upstream: Option<&Upstream>,
    problem: &mut Problem<'_>,
) -> Vec<RouteConfig> {
    let mut routes = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, r) in raw.iter().enumerate() {
        let key = |field: &str| format!("routes[{i}].{field}");
        if r.name.is_empty()
            || r.name.len() > 64
            || !r
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
        {
            problem(
                &key("name"),
                format!(
                    "`{}` must be 1 to 64 characters of letters, digits, _ - . :",
                    r.name
                ),
            );
        } else if r.name == "other" {
            problem(
                &key("name"),
                "`other` is reserved for requests that match no route".into(),
            );
        } else if !names.insert(r.name.clone()) {
            problem(
                &key("name"),
                format!("`{}` is used by another route", r.name),
            );
        }
        if let Some(route) = route(r, &key, upstream, problem) {
            routes.push(route);
        }
    }
    routes
}

/// One route's path, match, method, upstream and format.
fn route(
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
    upstream: Option<&Upstream>,
    problem: &mut Problem<'_>,
) -> Option<RouteConfig> {
    if !r.path.starts_with('/') {
        problem(&key("path"), format!("`{}` must start with /", r.path));
    }
    let match_kind = match r.match_kind.as_deref() {
        None | Some("prefix") => Some(PathMatch::Prefix),
        Some("exact") => Some(PathMatch::Exact),
        Some(other) => {
            problem(
                &key("match"),
                format!("`{other}` must be `prefix` or `exact`"),
            );
            None
        }
    };
    let method = match &r.method {
        None => Some(None),
        Some(m) => match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            Ok(method) => Some(Some(method)),
            Err(_) => {
                problem(&key("method"), format!("`{m}` is not an HTTP method"));
                None
            }
        },
    };
    let route_upstream = match &r.upstream {
        None => upstream.cloned(),
        Some(u) => Upstream::parse(u)
            .map_err(|e| problem(&key("upstream"), e))
            .ok(),
    };
    let format = match r.format.as_deref() {
        None | Some("auto") => Some(None),
        Some(name) => match Format::from_name(name) {
            Some(format) => Some(Some(format)),
            None => {
                problem(
                    &key("format"),
                    format!("`{name}` must be one of {}", format_names()),
                );
                None
            }
        },
    };
    let tags = match r.think_tags.as_deref() {
        None => Some(None),
        Some([open, close]) => match ThinkTags::new(open, close) {
            Some(tags) => Some(Some(Arc::new(tags))),
            None => {
                problem(
                    &key("think_tags"),
                    "each tag must be 1 to 64 bytes long".into(),
                );
                None
            }
        },
        Some(other) => {
            problem(
                &key("think_tags"),
                format!(
                    "must be two tags, opening and closing (found {})",
                    other.len()
                ),
            );
            None
        }
    };
    let start = if r.think_starts_open == Some(true) {
        ThinkStart::Open
    } else {
        ThinkStart::Detect
    };
    Some(RouteConfig {
        name: r.name.clone(),
        path: r.path.clone(),
        match_kind: match_kind?,
        method: method?,
        upstream: route_upstream?,
        format: format?,
        think: ThinkSettings { tags: tags?, start },
    })
}

/// Checks every section of `raw`, and puts the parts together when nothing is wrong.
pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let mut problem = |key: &str, reason: String| {
        problems.push(ConfigProblem {
            key: key.to_string(),
            reason,
        })
    };
    let server = server(&raw.server, &mut problem);
    let timeouts = timeouts(&raw.timeouts, &mut problem);
    let otlp = raw
        .otlp
        .validate()
        .map_err(|found| {
            for (key, reason) in found {
                problem(&key, reason);
            }
        })
        .ok()
        .flatten();
    let metering = metering(&raw.metering, &mut problem);
    let readiness = readiness(&raw.readiness, &mut problem);
    models(&raw.models, &mut problem);
    let tls = tls(&raw.tls, &mut problem);
    let upstream_tls = upstream_tls(&raw.upstream_tls, &mut problem);
    limits(&raw.limits, &mut problem);
    timeline(&raw.timeline, &mut problem);
    let flush_interval = metrics(&raw.buckets, &raw.metrics, &mut problem);
    let routes = routes(
        &raw.routes,
        server.as_ref().map(|s| &s.upstream),
        &mut problem,
    );
    let batch = validate_batch(&raw.batch, &mut problem);
    let admin = admin(&raw.admin, &mut problem);

    let (
        Some(server),
        Some(timeouts),
        Some(metering),
        Some(readiness),
        Some(flush_interval),
        Some(admin),
    ) = (server, timeouts, metering, readiness, flush_interval, admin)
    else {
        return Err(ConfigError(problems));
    };
    if !problems.is_empty() {
        return Err(ConfigError(problems));
    }
    Ok(Config {
        server,
        timeouts,
        metering,
        models: raw.models,
        buckets: raw.buckets.with_preset(raw.metrics.classic),
        metrics: raw.metrics,
        flush_interval,
        otlp,
        timeline: raw.timeline,
        tls,
        upstream_tls,
        limits: raw.limits,
        routes,
        readiness,
        batch,
        admin,
    })
}
