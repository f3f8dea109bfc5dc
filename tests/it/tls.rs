//! TLS on the listener (ALPN h2 and http/1.1), https and mTLS upstreams, certificate reload, and
//! the overload limits. Certificates are generated at test time.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use metronome::probe::{measure, summarize, Load, ProbeConfig, ProbeRun, Stop};
use metronome::proxy::ProxyHandle;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use support::*;
use tokio::net::TcpListener;

/// A CA and a leaf for `localhost` / 127.0.0.1 signed by it, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "metronome test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Writes a leaf certificate named `cn` to NAME.pem / NAME.key and returns the paths.
    fn leaf(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (c, k) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

fn https_client(ca: &Path, http2: bool) -> HttpsClient {
    let config = metronome::tls::client_config(Some(ca), None).unwrap();
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if http2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    };
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector)
}

async fn post(client: &HttpsClient, url: String) -> (u16, Vec<u8>) {
    let req = http::Request::post(url)
        .body(Full::new(Bytes::from(r#"{"stream":true}"#)))
        .unwrap();
    let response = client.request(req).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

/// A TLS connection to `localhost:port`, trusting `ca`, offering `alpn` (nothing when empty).
async fn tls_connect(
    ca: &Path,
    port: u16,
    alpn: &[&str],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut config = metronome::tls::client_config(Some(ca), None).unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// The CN of the certificate the server at `port` presents.
async fn served_cn(ca: &Path, port: u16) -> String {
    let tls = tls_connect(ca, port, &[]).await;
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let text = String::from_utf8_lossy(cert.as_ref()).to_string();
    ["cert-a", "cert-b"]
        .iter()
        .find(|cn| text.contains(*cn))
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// A proxy in front of `upstream` whose listener terminates TLS with `cert` and `key`.
async fn proxy_with_tls_listener(upstream: SocketAddr, cert: PathBuf, key: PathBuf) -> ProxyHandle {
    proxy_with(upstream, |c| {
        c.tls = Some(metronome::config::ListenerTls { cert, key });
    })
    .await
}

/// A proxy with a TLS listener (a `localhost` leaf of `pki`, CN `cert-a`) in front of an upstream
/// streaming `tokens` tokens 2 ms apart; with the bytes a client must receive through it.
async fn tls_proxy_streaming(pki: &Pki, tokens: usize) -> (ProxyHandle, Vec<u8>) {
    let (cert, key) = pki.leaf("server", "cert-a");
    let upstream = Upstream::openai_chat().tokens(tokens).every(ms(2));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    (
        proxy_with_tls_listener(upstream.addr, cert, key).await,
        expected,
    )
}

/// The inter-token gaps the egress point counted, once `streams` streams are recorded.
async fn egress_gaps_once_recorded(proxy: &ProxyHandle, streams: f64) -> f64 {
    let m = scrape_until(proxy, |m| {
        m.value("metronome_streams_total", &[]) == streams
    })
    .await;
    m.value(
        "metronome_inter_token_latency_seconds_count",
        &[("point", "egress")],
    )
}

/// A probe of `requests` streams, `concurrency` at a time, to `url`, trusting the test CA.
fn probe_trusting(pki: &Pki, url: &str, requests: u64, concurrency: usize) -> ProbeConfig {
    let mut config = ProbeConfig::new(url, "m").unwrap();
    config.stop = Stop::Requests(requests);
    config.load = Load::Closed { concurrency };
    config.timeout = std::time::Duration::from_secs(10);
    config.ca = Some(pki.ca_path());
    config
}

/// The errors of a probe run's streams, as text.
fn stream_errors(run: &ProbeRun) -> Vec<String> {
    run.streams
        .iter()
        .filter_map(|s| s.error.as_ref().map(|e| e.to_string()))
        .collect()
}

/// The chat URL on the proxy's TLS listener, by the name its certificate carries.
fn https_chat_url(proxy: &ProxyHandle) -> String {
    format!(
        "https://localhost:{}/v1/chat/completions",
        proxy.proxy_addr.port()
    )
}

#[tokio::test]
async fn the_listener_terminates_tls_over_http1_and_h2() {
    let pki = Pki::new();
    let (proxy, expected) = tls_proxy_streaming(&pki, 8).await;
    let url = https_chat_url(&proxy);
    for http2 in [false, true] {
        let (status, body) = post(&https_client(&pki.ca_path(), http2), url.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(body, expected, "http2={http2}");
    }
    assert_eq!(egress_gaps_once_recorded(&proxy, 2.0).await, 14.0);
    proxy.shutdown().await;
}

/// Streams one request over a TLS connection to `port` that offers `alpn` (none when empty) and
/// speaks HTTP/2 or HTTP/1.1 with hyper's client connection; the protocol the server agreed to
/// in ALPN, the status and the body.
async fn post_over_tls(
    ca: &Path,
    port: u16,
    alpn: &[&str],
    http2: bool,
) -> (Option<Vec<u8>>, u16, Vec<u8>) {
    let tls = tls_connect(ca, port, alpn).await;
    let agreed = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let io = TokioIo::new(tls);
    let request = |version| {
        http::Request::post(format!("https://localhost:{port}/v1/chat/completions"))
            .version(version)
            .header(http::header::HOST, format!("localhost:{port}"))
            .body(Full::new(Bytes::from(r#"{"stream":true}"#)))
            .unwrap()
    };
    let response = if http2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        sender
            .send_request(request(http::Version::HTTP_2))
            .await
            .unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender
            .send_request(request(http::Version::HTTP_11))
            .await
            .unwrap()
    };
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (agreed, status, body.to_vec())
}

#[tokio::test]
async fn the_listener_serves_the_protocol_alpn_agreed_and_tells_it_by_the_first_bytes_without_alpn()
{
    let pki = Pki::new();
    let (proxy, expected) = tls_proxy_streaming(&pki, 6).await;
    let port = proxy.proxy_addr.port();
    // What the client offers in ALPN, whether it speaks HTTP/2, what the server agrees to.
    let cases: [(&[&str], bool, Option<&str>); 4] = [
        (&["h2"], true, Some("h2")),
        (&["http/1.1"], false, Some("http/1.1")),
        // A client that names no protocol: HTTP/2 with prior knowledge, or HTTP/1.1.
        (&[], true, None),
        (&[], false, None),
    ];
    for (alpn, http2, agreed) in cases {
        let case = format!("alpn {alpn:?}, http2={http2}");
        let (got, status, body) = post_over_tls(&pki.ca_path(), port, alpn, http2).await;
        assert_eq!(got.as_deref(), agreed.map(str::as_bytes), "{case}");
        assert_eq!(status, 200, "{case}");
        assert_eq!(body, expected, "{case}");
    }
    assert_eq!(egress_gaps_once_recorded(&proxy, 4.0).await, 4.0 * 5.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn curl_with_cacert_streams_through_the_tls_listener() {
    let pki = Pki::new();
    let (proxy, expected) = tls_proxy_streaming(&pki, 5).await;
    let url = https_chat_url(&proxy);
    let ca = pki.ca_path();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sSN", "--cacert"])
            .arg(&ca)
            .args(["-d", "{}", &url])
            .output()
            .expect("curl is installed (CI installs it)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, expected);
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_probe_measures_streams_over_https_with_its_cacert_and_refuses_an_unknown_ca() {
    let pki = Pki::new();
    let (proxy, _) = tls_proxy_streaming(&pki, 6).await;
    let mut config = probe_trusting(&pki, &https_chat_url(&proxy), 4, 2);
    for http2 in [false, true] {
        config.http2 = http2;
        let run = measure(&config).await.unwrap();
        let report = summarize(&run, config.stall_threshold);
        let errors = stream_errors(&run);
        assert_eq!(
            (report.requests, report.errors),
            (4, 0),
            "http2={http2}: {errors:?}"
        );
        assert_eq!(report.detail.token_events, 4 * 6, "http2={http2}");
    }
    // The test CA is not among the system's roots: every stream fails to connect, and the
    // reason is given (hyper-util reports a connect raced by another stream's as "canceled").
    config.ca = None;
    let run = measure(&config).await.unwrap();
    assert_eq!(run.streams.len(), 4);
    let errors: Vec<_> = run
        .streams
        .iter()
        .filter_map(|s| s.error.as_ref())
        .collect();
    assert_eq!(errors.len(), 4, "an unknown CA is refused");
    assert!(errors.iter().all(|e| e.kind() == "connect"), "{errors:?}");
    // Each says why, or is a canceled connect; the report's example says why.
    for error in &errors {
        let why = error
            .to_string()
            .contains("invalid peer certificate: UnknownIssuer");
        assert_eq!(why, error.explains(), "{error:?}");
    }
    let report = summarize(&run, config.stall_threshold);
    let example = &report.detail.error_examples["connect"];
    assert!(example.contains("UnknownIssuer"), "{example}");
    let m = scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) == 8.0).await;
    assert_eq!(
        m.value("metronome_streams_total", &[("outcome", "complete")]),
        8.0
    );
    proxy.shutdown().await;
}

/// An https upstream serving a fixed SSE body; with `client_ca`, it demands a client certificate;
/// with `alpn`, it accepts only clients that offer one of those protocols.
async fn tls_upstream(cert: &Path, key: &Path, client_ca: Option<&Path>, alpn: &[&str]) -> u16 {
    use rustls::server::WebPkiClientVerifier;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = metronome::tls::load_certs(cert).unwrap();
    let key = metronome::tls::load_key(key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let config = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in metronome::tls::load_certs(ca).unwrap() {
                roots.add(c).unwrap();
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .unwrap()
        }
        None => builder
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    };
    let mut config = config;
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    let mut response = http::Response::new(Full::new(Bytes::from(
                        "data: {\"model\":\"tls-model\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
                    )));
                    response
                        .headers_mut()
                        .insert("content-type", "text/event-stream".parse().unwrap());
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn the_probe_offers_in_alpn_only_the_protocol_it_speaks() {
    // A server that accepts only h2, or only http/1.1, in ALPN refuses a client that does not
    // offer it: the probe offers exactly the protocol it was asked for (`--http2` or not), so
    // it cannot be switched to another without noticing.
    let pki = Pki::new();
    let (cert, key) = pki.leaf("alpn", "localhost");
    for (server, http2, served) in [
        ("h2", true, true),
        ("h2", false, false),
        ("http/1.1", false, true),
        ("http/1.1", true, false),
    ] {
        let port = tls_upstream(&cert, &key, None, &[server]).await;
        let url = format!("https://127.0.0.1:{port}/v1/chat/completions");
        let mut config = probe_trusting(&pki, &url, 2, 1);
        config.http2 = http2;
        let run = measure(&config).await.unwrap();
        let report = summarize(&run, config.stall_threshold);
        let errors = stream_errors(&run);
        let case = format!("server {server}, probe http2={http2}: {errors:?}");
        if served {
            assert_eq!((report.requests, report.errors), (2, 0), "{case}");
            assert_eq!(report.detail.token_events, 2, "{case}");
        } else {
            assert_eq!(report.errors, 2, "{case}");
            assert!(
                errors.iter().all(|e| e.contains("NoApplicationProtocol")
                    || e.contains("no_application_protocol")
                    || e.contains("canceled")),
                "refused for want of a common protocol: {case}"
            );
        }
    }
}

#[tokio::test]
async fn https_and_mtls_upstreams() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf("upstream", "cert-a");
    let (client_cert, client_key) = pki.leaf("client", "cert-b");
    let plain_port = tls_upstream(&cert, &key, None, &[]).await;
    let mtls_port = tls_upstream(&cert, &key, Some(&pki.ca_path()), &[]).await;
    let ca = pki.ca_path();
    let config_for = |port: u16, client: bool| {
        let ca = ca.clone();
        let (cc, ck) = (client_cert.clone(), client_key.clone());
        move |c: &mut metronome::config::Config| {
            c.server.upstream =
                metronome::config::Upstream::parse(&format!("https://localhost:{port}")).unwrap();
            c.routes.clear();
            c.upstream_tls.ca = Some(ca);
            if client {
                c.upstream_tls.client_cert = Some((cc, ck));
            }
        }
    };
    let unused = "127.0.0.1:9".parse().unwrap();

    let proxy = proxy_with(unused, config_for(plain_port, false)).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    assert!(String::from_utf8_lossy(&got.bytes()).contains("[DONE]"));
    proxy.shutdown().await;

    let proxy = proxy_with(unused, config_for(mtls_port, false)).await;
    assert_eq!(
        stream_chat(proxy.proxy_addr).await.status,
        502,
        "mTLS upstream refuses us without a client certificate"
    );
    proxy.shutdown().await;

    let proxy = proxy_with(unused, config_for(mtls_port, true)).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    let m = scrape_after_stream(&proxy).await;
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("model", "tls-model"), ("outcome", "complete")]
        ),
        1.0,
        "{}",
        m.0.lines()
            .filter(|l| l.contains("streams_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn sighup_reload_swaps_the_certificate_and_keeps_it_when_the_new_one_is_bad() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf("server", "cert-a");
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_with_tls_listener(upstream.addr, cert.clone(), key.clone()).await;
    let port = proxy.proxy_addr.port();
    assert_eq!(served_cn(&pki.ca_path(), port).await, "cert-a");
    // An established connection survives the reload.
    let client = https_client(&pki.ca_path(), false);
    let url = https_chat_url(&proxy);
    assert_eq!(post(&client, url.clone()).await.0, 200);

    let (b_cert, b_key) = pki.leaf("next", "cert-b");
    std::fs::copy(&b_cert, &cert).unwrap();
    std::fs::copy(&b_key, &key).unwrap();
    assert!(proxy.reload_tls().unwrap());
    assert_eq!(served_cn(&pki.ca_path(), port).await, "cert-b");
    assert_eq!(post(&client, url.clone()).await.0, 200);

    std::fs::write(&cert, "not a certificate").unwrap();
    assert!(proxy.reload_tls().is_err());
    assert_eq!(
        served_cn(&pki.ca_path(), port).await,
        "cert-b",
        "the old certificate stays"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn overload_limits_answer_at_once() {
    let upstream = Upstream::openai_chat()
        .tokens(50)
        .every(ms(20))
        .start()
        .await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.limits.max_requests = 1;
        c.limits.max_header_bytes = 8192;
        c.limits.max_request_body_bytes = 1024;
    })
    .await;
    let addr = proxy.proxy_addr;
    // One stream in flight takes the only request slot.
    let first = tokio::spawn(async move { stream_chat(addr).await });
    tokio::time::sleep(ms(200)).await;
    let busy = stream_chat(addr).await;
    assert_eq!(busy.status, 503);
    let body: serde_json::Value = serde_json::from_slice(&busy.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "overloaded");
    assert_eq!(first.await.unwrap().status, 200);
    scrape_after_stream(&proxy).await;

    // The slot is free again; a body over the limit is refused by its declared length.
    let big = "x".repeat(2000);
    let got = request(addr, "POST", "/v1/chat/completions", &big, false).await;
    assert_eq!(got.status, 413);

    // A head over the limit gets 431 from hyper.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let header = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    let _ = stream.write_all(header.as_bytes()).await;
    let mut answer = vec![0u8; 64];
    let n = stream.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 431"));
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_chunked_body_over_the_limit_gets_413() {
    let upstream = Upstream::json("{}").start().await;
    let proxy = proxy_with(upstream.addr, |c| c.limits.max_request_body_bytes = 1024).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    let chunk = "z".repeat(800);
    let raw = format!(
        "POST /v1/x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n320\r\n{chunk}\r\n320\r\n{chunk}\r\n0\r\n\r\n"
    );
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_get_503_and_close() {
    // The limit is one count over every worker thread: with four workers and a limit of two, the
    // third connection is refused whichever worker accepts it.
    let upstream = Upstream::json("{}").start().await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.limits.max_connections = 2;
        c.server.workers = std::num::NonZeroUsize::new(4);
    })
    .await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut connection = tokio::net::TcpStream::connect(proxy.proxy_addr)
            .await
            .unwrap();
        connection
            .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 512];
        let n = connection.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(connection);
    }
    let mut third = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        third.read_to_end(&mut answer),
    )
    .await
    .expect("the connection over the limit was kept open")
    .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("\"overloaded\""));
    drop(held);
    proxy.shutdown().await;
}

/// A TLS front on its own port that pipes each connection to `to`: an https upstream made of a
/// plain one (the sim).
async fn tls_front(cert: &Path, key: &Path, to: SocketAddr) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            metronome::tls::load_certs(cert).unwrap(),
            metronome::tls::load_key(key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut plain = tokio::net::TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_websocket_tunnels_to_an_https_upstream_and_its_responses_are_metered() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf("upstream", "ws-upstream");
    let sim = sim_with(metronome::sim::SimConfig {
        gap: ms(2),
        ttft: ms(5),
        tokens: 4,
        ..metronome::sim::SimConfig::default()
    })
    .await;
    let port = tls_front(&cert, &key, sim.addr()).await;
    let ca = pki.ca_path();
    let proxy = proxy_with("127.0.0.1:9".parse().unwrap(), move |c| {
        c.server.upstream =
            metronome::config::Upstream::parse(&format!("https://localhost:{port}")).unwrap();
        c.routes.clear();
        c.upstream_tls.ca = Some(ca);
    })
    .await;
    let url = format!("http://{}/v1/responses", proxy.proxy_addr);
    let mut config = ProbeConfig::new(&url, "sim-model").unwrap();
    config.body = Bytes::from_static(br#"{"model":"sim-model","input":"Hi"}"#);
    config.stop = Stop::Requests(2);
    config.websocket = Some(metronome::probe::WsSettings {
        protocol: metronome::probe::WsProtocol::from_path("/v1/responses").unwrap(),
        per_socket: 2,
        realtime: metronome::probe::RealtimeAsk {
            audio: false,
            beta: false,
        },
    });
    let run = measure(&config).await.unwrap();
    assert_eq!(
        stream_errors(&run),
        Vec::<String>::new(),
        "{:?}",
        run.streams[0].error_body
    );
    let m = scrape_until(&proxy, |m| {
        m.value(
            "metronome_streams_total",
            &[("route", "other"), ("outcome", "complete")],
        ) == 2.0
    })
    .await;
    assert_eq!(
        m.value(
            "metronome_stream_format_total",
            &[("format", "responses_websocket")]
        ),
        2.0
    );
    proxy.shutdown().await;
}
