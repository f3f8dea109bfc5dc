//! Memory stays bounded whatever the stream: one event of 100 MB without a line end, and a
//! client that stops reading while the upstream keeps writing (backpressure must reach the
//! upstream rather than the proxy buffering).
//!
//! These tests measure the resident set of the whole test process (`/proc/self/statm`), so they
//! live in their own test binary and run one at a time; the client checks every byte against
//! the script as it arrives and keeps none of them.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;

/// The tests here measure the process's memory: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MB: usize = 1024 * 1024;

const ITL: &str = "metronome_inter_token_latency_seconds_count";

/// The labels of what the proxy measured where it reads the upstream.
const CHAT_INGRESS: [(&str, &str); 2] = [("route", "chat"), ("point", "ingress")];

/// The resident set of this process, in bytes.
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * usize::try_from(page).unwrap()
}

/// Compares received bytes with the expected frames as they arrive, keeping none of them.
struct Expect {
    frames: Vec<Bytes>,
    frame: usize,
    offset: usize,
    /// Bytes checked so far.
    seen: usize,
}

impl Expect {
    fn new(frames: &[Bytes]) -> Self {
        Expect {
            frames: frames.to_vec(),
            frame: 0,
            offset: 0,
            seen: 0,
        }
    }

    fn total(&self) -> usize {
        self.frames.iter().map(Bytes::len).sum()
    }

    fn check(&mut self, mut got: &[u8]) {
        while !got.is_empty() {
            let want = &self
                .frames
                .get(self.frame)
                .unwrap_or_else(|| panic!("{} bytes more than the upstream sent", got.len()))
                [self.offset..];
            let n = want.len().min(got.len());
            assert!(
                want[..n] == got[..n],
                "the bytes differ from the upstream's at offset {}",
                self.seen
            );
            self.seen += n;
            got = &got[n..];
            self.offset += n;
            if self.offset == self.frames[self.frame].len() {
                self.frame += 1;
                self.offset = 0;
            }
        }
    }

    fn done(&self) -> bool {
        self.frame == self.frames.len()
    }
}

/// Reads a response body to its end, checking it against `expect` and sampling the process's
/// resident set every 4 MB. Returns the largest sample.
async fn read_checked(mut body: Incoming, expect: &mut Expect) -> usize {
    let mut peak = rss_bytes();
    let mut next_sample = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the body ends cleanly");
        if let Ok(data) = frame.into_data() {
            expect.check(&data);
            if expect.seen >= next_sample {
                peak = peak.max(rss_bytes());
                next_sample = expect.seen + 4 * MB;
            }
        }
    }
    assert!(
        expect.done(),
        "the body ended after {} of {} bytes",
        expect.seen,
        expect.total()
    );
    peak.max(rss_bytes())
}

/// An OpenAI chat chunk with `n` bytes of content.
fn token_event(n: usize) -> Bytes {
    let mut event = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec();
    event.extend(std::iter::repeat_n(b'x', n));
    event.extend_from_slice(b"\"}}]}\n\n");
    Bytes::from(event)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_of_100_mb_without_a_line_end_passes_in_bounded_memory() {
    let _serial = SERIAL.lock().await;
    // `data: ` and 100 MB on one line (1600 frames of 64 KiB, all the same `Bytes`, so the
    // script itself takes no memory), then its blank line, then three ordinary token events.
    let block = Bytes::from(vec![b'x'; 64 * 1024]);
    let mut frames = vec![Bytes::from_static(b"data: ")];
    frames.extend(std::iter::repeat_n(block, 1600));
    frames.push(Bytes::from_static(b"\n\n"));
    frames.extend((0..3).map(|_| token_event(8)));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    let upstream = Upstream::sse_frames(&frames, Duration::ZERO).start().await;
    let proxy = proxy_to(upstream.addr).await;
    let max_event_bytes = proxy.state.config.metering.max_event_bytes;
    assert_eq!(max_event_bytes, 64 * 1024, "the default bound");

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
        .unwrap();
    let before = rss_bytes();
    let started = Instant::now();
    let response = client.request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut expect = Expect::new(&frames);
    let peak = read_checked(response.into_body(), &mut expect).await;
    let elapsed = started.elapsed();
    assert!(expect.seen > 100 * MB);
    let growth = peak.saturating_sub(before);
    eprintln!(
        "100 MB event: {} bytes in {elapsed:?}; resident set {} MB before, peak growth {:.1} MB",
        expect.seen,
        before / MB,
        growth as f64 / MB as f64
    );
    assert!(
        growth < 64 * MB,
        "the resident set grew by {growth} bytes while {} passed",
        expect.seen
    );

    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    assert_eq!(
        m.value(
            "metronome_unparsed_events_total",
            &[("route", "chat"), ("reason", "oversize")]
        ),
        1.0,
        "the long event is counted, not inspected"
    );
    assert_eq!(
        m.value(ITL, &CHAT_INGRESS),
        2.0,
        "the scanner carries on after the long event: three token events"
    );
    assert_eq!(
        m.value("metronome_events_per_frame_sum", &CHAT_INGRESS),
        5.0,
        "the long event, three token events, [DONE]"
    );
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_stops_the_upstream_with_a_small_buffer_bound() {
    let _serial = SERIAL.lock().await;
    // 4096 token events of 16 KiB: 64 MB the upstream would write in well under a second to a
    // client that read it.
    const FRAMES: usize = 4096;
    let event = token_event(16 * 1024 - 64);
    let frames = vec![event.clone(); FRAMES];
    let total = event.len() * FRAMES;
    let upstream = Upstream::sse_frames(&frames, Duration::ZERO).start().await;
    let proxy = proxy_with(upstream.addr, |c| c.metering.buffer_bytes = 16 * 1024).await;

    // A client with a 16 KiB receive buffer that reads the head, then nothing for a while.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let tcp = socket.connect(proxy.proxy_addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "metronome.test")
        .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
        .unwrap();
    let before = rss_bytes();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);

    // The upstream writes until the socket buffers on the way and the proxy's 16 KiB are full,
    // then its writes block: wait until it has taken no frame for 300 ms, then check that it
    // stays put for another 500 ms while the client still reads nothing.
    let taken = || upstream.stats.frames_taken.load(Ordering::SeqCst);
    let stalled_since = Instant::now();
    let mut last = taken();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = taken();
        if now == last {
            break;
        }
        last = now;
        assert!(
            stalled_since.elapsed() < Duration::from_secs(10),
            "the upstream never stopped writing ({now} frames)"
        );
    }
    let rss_stalled = rss_bytes();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        taken(),
        last,
        "the upstream's writes stay blocked while the client does not read"
    );
    let ahead = last * event.len();
    eprintln!(
        "stalled client: the upstream got {last} of {FRAMES} frames ({:.1} MB of {:.1} MB) ahead; \
         resident set growth {:.1} MB",
        ahead as f64 / MB as f64,
        total as f64 / MB as f64,
        rss_stalled.saturating_sub(before) as f64 / MB as f64
    );
    // How far ahead is the socket buffers' doing (the kernel autotunes them, several MB on
    // loopback); without backpressure the upstream would have written all 64 MB.
    assert!(
        ahead < total / 2,
        "backpressure reached the upstream: {ahead} of {total} bytes written"
    );
    assert!(
        rss_stalled.saturating_sub(before) < 32 * MB,
        "the proxy does not buffer what the client does not read"
    );

    // Now the client reads everything, and gets every byte.
    let mut expect = Expect::new(&frames);
    let peak = read_checked(response.into_body(), &mut expect).await;
    assert!(peak.saturating_sub(before) < 64 * MB);
    drop(sender);
    conn.await.unwrap().unwrap();
    assert_eq!(upstream.stats.frames_taken.load(Ordering::SeqCst), FRAMES);

    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    assert_eq!(m.value(ITL, &CHAT_INGRESS), (FRAMES - 1) as f64);
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
    proxy.shutdown().await;
}
