//! Reloading the configuration under running streams, by calling the reload functions directly
//! (tests/it/signals.rs sends the real SIGHUP to the binary).

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use metronome::config::{Config, ServeArgs};
use metronome::proxy::reload::{apply, reload};
use support::*;

const STALLS: &str = "metronome_stalls_total";

/// The configuration `proxy_with` starts from, with these tables added.
fn config(upstream: std::net::SocketAddr, extra_tables: &str) -> Config {
    Config::from_toml(&format!("{}{extra_tables}\n", proxy_toml(upstream))).unwrap()
}

async fn streams_done(proxy: &metronome::proxy::ProxyHandle, n: f64) -> Metrics {
    scrape_until(proxy, |m| m.value("metronome_streams_total", &[]) >= n).await
}

#[tokio::test]
async fn a_new_stall_threshold_applies_to_the_next_stream() {
    // One 150 ms pause: not a stall at the default 200 ms, a stall at 100 ms.
    let upstream = Upstream::openai_chat()
        .tokens(12)
        .every(ms(5))
        .stall_before(6, ms(150))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    stream_chat(proxy.proxy_addr).await;
    let m = streams_done(&proxy, 1.0).await;
    assert_eq!(m.value(STALLS, &[("point", "ingress")]), 0.0);

    let done = apply(
        &proxy.state,
        config(upstream.addr, "[metering]\nstall_threshold = \"100ms\""),
    );
    assert_eq!(
        done.applied,
        vec!["metering.stall_threshold: 200ms -> 100ms".to_string()]
    );
    assert!(done.needs_restart.is_empty(), "{:?}", done.needs_restart);
    assert_eq!(proxy.state.metrics.stall_threshold(), ms(100));

    stream_chat(proxy.proxy_addr).await;
    let m = streams_done(&proxy, 2.0).await;
    assert_eq!(m.value(STALLS, &[("point", "ingress")]), 1.0);
    assert_eq!(m.value(STALLS, &[("point", "egress")]), 1.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn new_routes_and_upstreams_apply_to_new_requests_while_a_stream_in_flight_keeps_its_own() {
    let first = Upstream::openai_chat().tokens(20).every(ms(25));
    let expected = first.expected_bytes();
    let first = first.start().await;
    let second = Upstream::openai_chat().model("second-model").start().await;
    let proxy = proxy_to(first.addr).await;
    let addr = proxy.proxy_addr;

    let in_flight = tokio::spawn(async move { stream_chat(addr).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while first.stats.requests.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(ms(10)).await;
    }

    // The chat route is renamed and the default upstream moves to the second server.
    let new = Config::from_toml(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "http://{}"
drain_grace = "2s"
[[routes]]
name = "chat-v2"
path = "/v1/chat/completions"
match = "exact"
"#,
        second.addr
    ))
    .unwrap();
    let done = apply(&proxy.state, new);
    let applied = done.applied.join("\n");
    assert!(
        applied.contains("server.upstream: http://127.0.0.1:"),
        "{applied}"
    );
    assert!(applied.contains("route `chat-v2` added"), "{applied}");
    assert!(applied.contains("route `chat` removed"), "{applied}");
    // Listener addresses differ (port 0 was bound to real ports, the file says 0 again): no.
    assert!(done.needs_restart.is_empty(), "{:?}", done.needs_restart);

    let next = stream_chat(addr).await;
    assert_eq!(next.status, 200);
    assert_eq!(second.stats.requests.load(Ordering::SeqCst), 1);

    let got = in_flight.await.unwrap();
    assert!(got.error.is_none(), "{:?}", got.error);
    assert_eq!(got.bytes(), expected, "the stream in flight is untouched");
    assert_eq!(first.stats.requests.load(Ordering::SeqCst), 1);

    let m = streams_done(&proxy, 2.0).await;
    let complete = |route| {
        m.value(
            "metronome_streams_total",
            &[("route", route), ("outcome", "complete")],
        )
    };
    assert_eq!(complete("chat"), 1.0, "the old stream keeps its route");
    assert_eq!(
        complete("chat-v2"),
        1.0,
        "the new stream gets the new route"
    );
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("route", "chat-v2"), ("model", "second-model")]
        ),
        1.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn what_needs_a_restart_is_reported_and_kept() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_to(upstream.addr).await;
    let before = proxy.state.live_config();
    let done = apply(
        &proxy.state,
        config(
            upstream.addr,
            "[timeouts]\nidle = \"7s\"\n[buckets]\nitl = [0.1, 0.2]\n[models]\nmax = 3",
        ),
    );
    assert!(done.applied.is_empty(), "{:?}", done.applied);
    let restart = done.needs_restart.join("\n");
    for key in [
        "timeouts.idle: 7s in the file, still 120s",
        "buckets",
        "models",
    ] {
        assert!(restart.contains(key), "{key} missing in {restart}");
    }
    let after = proxy.state.live_config();
    assert_eq!(after.timeouts.idle, before.timeouts.idle);
    assert_eq!(after.buckets, before.buckets);
    assert_eq!(after.models, before.models);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_broken_file_is_refused_counted_and_changes_nothing() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_with(upstream.addr, |c| c.metering.stall_threshold = ms(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metronome.toml");
    std::fs::write(
        &file,
        "[metering]\nstall_threshold = \"fast\"\n[[routes]]\nname = \"other\"\npath = \"/\"\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(file.clone()),
        ..ServeArgs::default()
    };

    let err = reload(&proxy.state, &args).unwrap_err();
    let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, vec!["metering.stall_threshold", "routes[0].name"]);
    assert_eq!(proxy.state.metrics.stall_threshold(), ms(300));
    assert_eq!(proxy.state.live_config().routes[0].name, "chat");
    let m = scrape(&proxy).await;
    assert_eq!(m.value("metronome_config_reload_failures_total", &[]), 1.0);

    // Fixed, the same file reloads; the CLI overrides would still win over it.
    std::fs::write(
        &file,
        format!(
            "routes = []\n[server]\nupstream = \"http://{}\"\n[metering]\nstall_threshold = \"250ms\"\n",
            upstream.addr
        ),
    )
    .unwrap();
    let args = ServeArgs {
        stall_threshold: Some("220ms".into()),
        ..args
    };
    let done = reload(&proxy.state, &args).unwrap();
    assert!(done
        .applied
        .contains(&"metering.stall_threshold: 300ms -> 220ms".to_string()));
    assert!(done.applied.contains(&"route `chat` removed".to_string()));
    assert_eq!(proxy.state.metrics.stall_threshold(), ms(220));
    let m = scrape(&proxy).await;
    assert_eq!(m.value("metronome_config_reload_failures_total", &[]), 1.0);
    proxy.shutdown().await;
}

/// An empty or cut-short file is valid TOML whose every section is the default: it must not
/// take the routes away or send the traffic to the built-in upstream unless it says so.
#[tokio::test]
async fn an_empty_or_cut_short_file_does_not_reset_routes_or_upstream() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_to(upstream.addr).await;
    let whole = proxy_toml(upstream.addr);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metronome.toml");
    let args = ServeArgs {
        config: Some(file.clone()),
        ..ServeArgs::default()
    };
    let cut = &whole[..whole.find("[[routes]]").unwrap()];
    let no_server = &whole[whole.find("[[routes]]").unwrap()..];
    for (text, keys) in [
        ("", vec!["routes", "server.upstream"]),
        (
            "\n# nothing but a comment\n",
            vec!["routes", "server.upstream"],
        ),
        (cut, vec!["routes"]),
        (no_server, vec!["server.upstream"]),
    ] {
        std::fs::write(&file, text).unwrap();
        let err = reload(&proxy.state, &args).unwrap_err();
        let found: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(found, keys, "{text:?}");
        let live = proxy.state.live_config();
        assert_eq!(live.routes.len(), 1, "{text:?}");
        assert_eq!(
            live.server.upstream.authority.as_str(),
            upstream.addr.to_string()
        );
    }
    let m = scrape(&proxy).await;
    assert_eq!(m.value("metronome_config_reload_failures_total", &[]), 4.0);
    assert_eq!(stream_chat(proxy.proxy_addr).await.status, 200);

    // Said on purpose, both go; and a flag may name the upstream the file leaves out.
    std::fs::write(&file, format!("routes = []\n{cut}")).unwrap();
    let done = reload(&proxy.state, &args).unwrap();
    assert!(done.applied.contains(&"route `chat` removed".to_string()));
    assert!(proxy.state.live_config().routes.is_empty());
    std::fs::write(&file, "routes = []\n").unwrap();
    let flagged = ServeArgs {
        upstream: Some(format!("http://{}/v1", upstream.addr)),
        ..args.clone()
    };
    reload(&proxy.state, &flagged).unwrap();
    assert_eq!(proxy.state.live_config().server.upstream.base_path, "/v1");
    proxy.shutdown().await;
}

/// `timeouts.client_head` applies on reload: a connection accepted after it has its partial
/// head closed at the new bound (500 ms), not the start one (30 s), on both HTTP/1 servers.
#[tokio::test]
async fn a_new_client_head_bounds_the_heads_of_new_connections() {
    use metronome::config::ServerKind;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::openai_chat().start().await;
    for kind in [ServerKind::Native, ServerKind::Hyper] {
        let proxy = proxy_with(upstream.addr, |config| {
            config.server.http1_server = kind;
            config.timeouts.client_head = Duration::from_secs(30);
        })
        .await;
        let mut new = config(upstream.addr, "[timeouts]\nclient_head = \"500ms\"");
        new.server.http1_server = kind;
        let done = apply(&proxy.state, new);
        assert_eq!(
            done.applied,
            vec!["timeouts.client_head: 30s -> 500ms".to_string()],
            "{kind:?}"
        );
        assert!(done.needs_restart.is_empty(), "{:?}", done.needs_restart);
        assert_eq!(proxy.state.live_config().timeouts.client_head, ms(500));

        let mut client = tokio::net::TcpStream::connect(proxy.proxy_addr)
            .await
            .unwrap();
        let started = Instant::now();
        client
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(15), client.read_to_end(&mut rest));
        assert!(
            closed.await.is_ok(),
            "{kind:?}: the partial head is still open"
        );
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "{kind:?}: closed after {took:?}"
        );
        assert_eq!(stream_chat(proxy.proxy_addr).await.status, 200, "{kind:?}");
        proxy.shutdown().await;
    }
}
