//! A panicking stream task must not take down other streams. Nothing reachable from the network
//! is known to panic, so the panic is injected where the proxy would meet one: in the ingress
//! reader task, which polls the upstream body and runs the scanner and the accountant. The
//! metered body is driven through the same public `meter` entry point the proxy uses.
//!
//! This relies on panics unwinding (tokio catches a task's panic and drops the task); a build
//! with `panic = "abort"` would lose every stream of the process instead. The panic is
//! deliberate and located in tests/, so the panic count of tests/it/faults.rs, in the same binary,
//! leaves it out.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use metronome::config::Config;
use metronome::format::Accounting;
use metronome::metering::ledger::{StreamInfo, StreamLedger};
use metronome::proxy::egress_clock::EgressClock;
use metronome::proxy::metered::{meter, MeterSettings};
use metronome::proxy::ProxyState;
use metronome::scan::Framing;

/// An upstream body: one frame every `every`; panics instead of its frame number `panic_at`.
struct UpstreamBody {
    frames: VecDeque<Bytes>,
    every: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    sent: usize,
    panic_at: Option<usize>,
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if self.panic_at == Some(self.sent) {
            panic!("injected panic in an upstream body");
        }
        let next = tokio::time::Instant::now() + self.every;
        self.sleep.as_mut().reset(next);
        self.sent += 1;
        Poll::Ready(self.frames.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

fn token_event(i: usize) -> Bytes {
    Bytes::from(format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_stream_task_does_not_take_down_other_streams() {
    const STREAMS: usize = 20;
    const PANICKING: usize = 7;
    const FRAMES: usize = 10;
    let state = Arc::new(ProxyState::new(Config::default()).unwrap());
    let settings = MeterSettings {
        framing: Framing::Sse,
        max_event_bytes: 64 * 1024,
        buffer_bytes: 256 * 1024,
        buffer_frames: 64,
        idle_timeout: Duration::from_secs(10),
        client_http1: false,
        live: None,
        backpressure: Some(state.backpressure.clone()),
    };
    let frames: Vec<Bytes> = (0..FRAMES).map(token_event).collect();

    // Every stream runs 10 frames 10 ms apart; stream 7's reader panics at its fourth frame,
    // while the others are mid-stream.
    let mut clients = Vec::new();
    for n in 0..STREAMS {
        let upstream = UpstreamBody {
            frames: frames.iter().cloned().collect(),
            every: Duration::from_millis(10),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            sent: 0,
            panic_at: (n == PANICKING).then_some(3),
        };
        let ledger = StreamLedger::open(
            state.metrics.clone(),
            state.registry.clone(),
            StreamInfo {
                id: Arc::from(format!("stream-{n}")),
                route: Arc::from("chat"),
                received: metronome::metering::clock::Tick::now(),
                started_unix_ms: 0,
                content_type: "text/event-stream".into(),
                traceparent: None,
                request_id: None,
                line: Default::default(),
                status: 200,
                slo: None,
                span: None,
            },
            None,
        );
        let clock = Arc::new(EgressClock::new());
        let body = meter(
            upstream,
            &settings,
            Accounting::openai(),
            Default::default(),
            ledger,
            clock.clone(),
            Box::pin(tokio::time::sleep(settings.idle_timeout)),
        );
        clients.push(tokio::spawn(async move {
            let mut body = body;
            let mut got = Vec::new();
            let mut error = None;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => got.extend_from_slice(&frame.into_data().unwrap()),
                    Err(e) => {
                        error = Some(e.to_string());
                        break;
                    }
                }
            }
            // The frames handed off wait on the connection's clock for a socket write that
            // never comes here; dropping it lets the ledgers go, as a closed connection would.
            drop(body);
            drop(clock);
            (got, error)
        }));
    }

    for (n, client) in clients.into_iter().enumerate() {
        let (got, error) = client.await.expect("a client task itself never panics");
        if n == PANICKING {
            assert_eq!(got, frames[..3].concat(), "what came before the panic");
            assert_eq!(
                error.as_deref(),
                Some("the stream's ingress reader stopped unexpectedly"),
                "the response is aborted, not ended as complete"
            );
        } else {
            assert_eq!(got, frames.concat(), "stream {n} is whole");
            assert_eq!(error, None, "stream {n}");
        }
    }

    let metrics = &state.metrics;
    // The panicked reader never reported its model: that stream is labelled `unknown`.
    // Summed over the models and finish reasons it was recorded under.
    let outcome = |o: &str| {
        prometheus::core::Collector::collect(&metrics.streams)
            .iter()
            .flat_map(|family| family.get_metric())
            .filter(|m| {
                let label = |name: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value().to_string())
                };
                label("route").as_deref() == Some("chat")
                    && matches!(label("model").as_deref(), Some("m" | "unknown"))
                    && label("outcome").as_deref() == Some(o)
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum::<u64>()
    };
    // There is no client socket in this test, so no frame ever gets an egress stamp: the
    // healthy streams, whole at the client above, are recorded as not delivered
    // (`client_cancelled`), since delivery is judged by the socket.
    let deadline = Instant::now() + Duration::from_secs(5);
    while outcome("client_cancelled") + outcome("upstream_error") < STREAMS as u64 {
        assert!(Instant::now() < deadline, "not every stream was recorded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(outcome("client_cancelled"), (STREAMS - 1) as u64);
    assert_eq!(outcome("complete"), 0);
    // It is recorded as failed, exactly once.
    assert_eq!(outcome("upstream_error"), 1);
    assert_eq!(metrics.streams_active.with_label_values(&["chat"]).get(), 0);
}
