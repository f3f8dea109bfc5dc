//! What an OTLP receiver can make metronome hold: an answer body that never ends is cut at
//! `MAX_REPLY_BYTES` on both transports (HTTP/1.1 POST and gRPC over HTTP/2), one that trickles
//! ends at `otlp.timeout`, and each is a failed export; the process's memory stays within a
//! stated bound while it happens. And a receiver that never answers, behind stall-heavy streams,
//! keeps the span queue within `otlp.traces_queue_bytes`.
//!
//! The tests read this process's resident set size, so they run one at a time.

#![cfg(feature = "otlp")]

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metronome::config::otlp::RawOtlp;
use metronome::otlp::transport::{ExportError, Signal, Transport, MAX_REPLY_BYTES};
use tokio::net::TcpListener;

/// One test at a time: each reads the whole process's memory.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How much the process's resident set may grow while a receiver answers without end: the
/// bound on the answer (64 KiB) and the connections' buffers are far below it; without the
/// bound the growth is hundreds of megabytes a second.
const RSS_BOUND: u64 = 32 * 1024 * 1024;

/// This process's resident set size, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// A response body that never ends: `chunk` bytes a frame, every `every` (zero: at once).
struct Endless {
    chunk: Bytes,
    every: Duration,
    next: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if !self.every.is_zero() {
            let every = self.every;
            let sleep = self
                .next
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.next = None;
        }
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }
}

/// A receiver on 127.0.0.1 that answers every request 200 with an endless body, over HTTP/1.1
/// or (`grpc`) HTTP/2 with prior knowledge, as a collector's two ports do.
async fn endless_receiver(grpc: bool, chunk: usize, every: Duration) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = service_fn(move |_request| async move {
                let body = Endless {
                    chunk: Bytes::from(vec![b'x'; chunk]),
                    every,
                    next: None,
                };
                let mut response = http::Response::new(body);
                let kind = if grpc {
                    "application/grpc"
                } else {
                    "application/x-protobuf"
                };
                response
                    .headers_mut()
                    .insert("content-type", http::HeaderValue::from_static(kind));
                Ok::<_, Infallible>(response)
            });
            tokio::spawn(async move {
                let io = TokioIo::new(tcp);
                let _ = if grpc {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                };
            });
        }
    });
    addr
}

fn transport(receiver: std::net::SocketAddr, grpc: bool, timeout: &str) -> Transport {
    let raw = RawOtlp {
        endpoint: format!("http://{receiver}"),
        protocol: if grpc { "grpc" } else { "http/protobuf" }.into(),
        timeout: timeout.into(),
        ..RawOtlp::default()
    };
    let config = raw.validate().unwrap().unwrap();
    Transport::new(&config, metronome::tls::client_config(None, None).unwrap())
}

/// Sends one export and samples the resident set every 5 ms meanwhile: the outcome, how long
/// it took, and the largest growth seen.
async fn export_watching_memory(transport: &Transport) -> (Result<(), ExportError>, Duration, u64) {
    let before = rss();
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let began = Instant::now();
    let outcome = transport.send(Signal::Metrics, vec![0; 16]).await;
    let took = began.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::Relaxed).saturating_sub(before);
    (outcome, took, grew)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_cut_at_the_bound_over_http_and_grpc() {
    let _alone = ALONE.lock().await;
    for grpc in [false, true] {
        let receiver = endless_receiver(grpc, 64 * 1024, Duration::ZERO).await;
        let transport = transport(receiver, grpc, "2s");
        let (outcome, took, grew) = export_watching_memory(&transport).await;
        let transport_name = if grpc { "grpc" } else { "http/protobuf" };
        println!(
            "{transport_name}: {outcome:?} after {took:?}, resident set grew {} KiB",
            grew / 1024
        );
        assert!(
            matches!(outcome, Err(ExportError::ReplyTooLarge(MAX_REPLY_BYTES))),
            "{transport_name}: {outcome:?}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{transport_name}: cut at the bound, not the timeout"
        );
        assert!(grew < RSS_BOUND, "{transport_name}: grew {grew} bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_answer_ends_at_the_timeout() {
    let _alone = ALONE.lock().await;
    for grpc in [false, true] {
        let receiver = endless_receiver(grpc, 16, Duration::from_millis(20)).await;
        let transport = transport(receiver, grpc, "500ms");
        let (outcome, took, _) = export_watching_memory(&transport).await;
        assert!(
            matches!(outcome, Err(ExportError::Timeout(_))),
            "grpc {grpc}: {outcome:?}"
        );
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(5),
            "grpc {grpc}: {took:?}"
        );
    }
}

/// A receiver that takes connections and never answers: every export waits its whole timeout.
async fn black_hole() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_span_queue_stays_within_its_bytes_under_a_black_hole_receiver() {
    let _alone = ALONE.lock().await;
    let upstream = support::Upstream::openai_chat()
        .tokens(300)
        .every(support::ms(2))
        .start()
        .await;
    let bound = 64 * 1024;
    let toml = format!(
        "{}\n[metering]\nstall_threshold = \"1ms\"\n[otlp]\nendpoint = \"http://{}\"\ntimeout = \"2s\"\ntraces = true\ntraces_queue_bytes = {bound}\n",
        support::proxy_toml(upstream.addr),
        black_hole().await
    );
    let proxy =
        metronome::proxy::ProxyHandle::start(metronome::config::Config::from_toml(&toml).unwrap())
            .await
            .unwrap();
    let sink = proxy.state.spans.clone().unwrap();
    // 100 streams, not 40: at a load average of 12, 40 queued 61,824 bytes and never
    // reached the bound, so the test saw no drop.
    let streams = 100;
    let addr = proxy.proxy_addr;
    let clients = tokio::spawn(futures_util::future::join_all(
        (0..streams).map(move |_| support::stream_chat(addr)),
    ));
    let mut most = 0;
    while !clients.is_finished() {
        most = most.max(sink.queued_bytes());
        tokio::time::sleep(support::ms(5)).await;
    }
    clients.await.unwrap();
    support::scrape_until(&proxy, |m| {
        m.value("metronome_streams_total", &[]) >= streams as f64
    })
    .await;
    most = most.max(sink.queued_bytes());
    let dropped = |reason| sink.dropped.with_label_values(&[reason]).get();
    println!(
        "{streams} stall-heavy streams, a receiver that never answers: at most {most} bytes queued, {} dropped for bytes, {} for count",
        dropped("queue_bytes"),
        dropped("queue_full")
    );
    assert!(most <= bound, "{most} bytes queued");
    assert!(dropped("queue_bytes") > 0, "the bound was reached");
    assert_eq!(dropped("queue_full"), 0);
    proxy.shutdown().await;
}
