//! Upstreams that answer what a proxy must not pass on, through every client path:
//! the native client (http://), hyper's client for http:// (`upstream_client = "hyper"`), and
//! hyper's client for https://, which serves every TLS upstream. Each upstream here writes the
//! exact bytes a test scripts, so nothing in between can tidy them.
//!
//! Also what a client is told when the upstream cannot be reached: the kind of failure, never the
//! upstream's address or the OS error, which go to the log.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metronome::config::ClientKind;
use metronome::config::{Config, Upstream as UpstreamUrl};
use metronome::proxy::ProxyHandle;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// Which client the proxy sends through.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// http://, metronome's own client.
    Native,
    /// http://, hyper's client.
    Hyper,
    /// https://, hyper's client.
    HyperTls,
}

const PATHS: [Path; 3] = [Path::Native, Path::Hyper, Path::HyperTls];

/// A CA-signed certificate for `localhost`, as PEM files the upstream and the proxy read.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "hostile test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("leaf.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("leaf.key"), key.serialize_pem()).unwrap();
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = metronome::tls::load_certs(&self.file("leaf.pem")).unwrap();
        let key = metronome::tls::load_key(&self.file("leaf.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// Reads one request (its head, and a body by `content-length`), writes `answer`, and closes
/// the writing side; reads on until the proxy closes, so nothing unread resets the answer.
async fn answer_once(mut io: impl AsyncRead + AsyncWrite + Unpin, answer: &[u8]) {
    if !support::read_request(&mut io).await {
        return;
    }
    if io.write_all(answer).await.is_err() {
        return;
    }
    let _ = io.shutdown().await;
    let mut chunk = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(n) = io.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// An upstream that answers every request, on every connection, with `answer`; over TLS when
/// `tls` is given.
async fn scripted_upstream(
    answer: &'static [u8],
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(io) = acceptor.accept(tcp).await {
                            answer_once(io, answer).await;
                        }
                    }
                    None => answer_once(tcp, answer).await,
                }
            });
        }
    });
    addr
}

/// A proxy in front of an upstream answering `answer`, through `path`'s client.
async fn proxy_through(path: Path, answer: &'static [u8], pki: &Pki) -> ProxyHandle {
    let tls = matches!(path, Path::HyperTls).then(|| pki.acceptor());
    let upstream = scripted_upstream(answer, tls).await;
    let ca = pki.file("ca.pem");
    proxy_with(upstream, move |c: &mut Config| {
        c.readiness.check_upstream = false;
        match path {
            Path::Native => c.server.upstream_client = ClientKind::Native,
            Path::Hyper => c.server.upstream_client = ClientKind::Hyper,
            Path::HyperTls => {
                let url = format!("https://localhost:{}", upstream.port());
                c.server.upstream = UpstreamUrl::parse(&url).unwrap();
                c.routes.clear();
                c.upstream_tls.ca = Some(ca);
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_content_length_beside_chunked_is_dropped_and_the_body_arrives_whole() {
    let pki = Pki::new();
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\
        transfer-encoding: chunked\r\n\r\n6\r\nabcdef\r\n0\r\n\r\n";
    for path in PATHS {
        let proxy = proxy_through(path, ANSWER, &pki).await;
        let got = request(proxy.proxy_addr, "GET", "/v1/models", "", false).await;
        assert_eq!(got.status, 200, "{path:?}");
        assert_eq!(got.bytes(), b"abcdef", "{path:?}: {:?}", got.error);
        assert!(got.error.is_none(), "{path:?}: {:?}", got.error);
        assert!(
            !got.headers.contains_key("content-length"),
            "{path:?}: {:?}",
            got.headers
        );
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn an_interim_answer_other_than_100_or_103_is_a_502() {
    let pki = Pki::new();
    const SWITCHED: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n\
        upgrade: websocket\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n";
    const PROCESSING: &[u8] =
        b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    const HINTED: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\
        link: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    for path in PATHS {
        for (answer, status) in [(SWITCHED, 101), (PROCESSING, 102)] {
            let proxy = proxy_through(path, answer, &pki).await;
            let got = request(proxy.proxy_addr, "GET", "/v1/models", "", false).await;
            let case = format!("{path:?}, {status}");
            assert_eq!(got.status, 502, "{case}");
            assert_eq!(got.headers["content-type"], "application/json", "{case}");
            let body: serde_json::Value = serde_json::from_slice(&got.bytes()).unwrap();
            assert_eq!(body["error"]["type"], "upstream_unavailable", "{case}");
            let m = scrape(&proxy).await;
            assert_eq!(
                m.value(
                    "metronome_upstream_errors_total",
                    &[("route", "other"), ("kind", "protocol")]
                ),
                1.0,
                "{case}"
            );
            proxy.shutdown().await;
        }
        let proxy = proxy_through(path, HINTED, &pki).await;
        let got = request(proxy.proxy_addr, "GET", "/v1/models", "", false).await;
        assert_eq!((got.status, got.bytes()), (200, b"ok".to_vec()), "{path:?}");
        proxy.shutdown().await;
    }
}

/// Every log line the test process writes, captured once for all tests here.
fn log_lines() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
}

/// A log writer into the shared buffer.
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_unreachable_upstreams_502_names_neither_its_address_nor_the_os_error() {
    let log = log_lines();
    for kind in [ClientKind::Native, ClientKind::Hyper] {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let proxy = proxy_with(closed, |c| {
            c.readiness.check_upstream = false;
            c.server.upstream_client = kind;
        })
        .await;
        let got = stream_chat(proxy.proxy_addr).await;
        let body = String::from_utf8(got.bytes()).unwrap();
        let case = format!("{kind:?}: {body}");
        assert_eq!(got.status, 502, "{case}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["type"], "upstream_unavailable", "{case}");
        let port = closed.port().to_string();
        for secret in [port.as_str(), "127.0.0.1", "refused", "os error"] {
            assert!(!body.contains(secret), "{case} names {secret}");
        }
        proxy.shutdown().await;
        // The log line has what the client was not told.
        let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("upstream request failed") && l.contains(&closed.to_string()))
            .unwrap_or_else(|| panic!("{kind:?}: no log line names {closed}:\n{text}"));
        assert!(line.contains("Connection refused"), "{kind:?}: {line}");
        assert!(
            line.contains("kind=\"connect\"") || line.contains("kind=connect"),
            "{line}"
        );
    }
}
