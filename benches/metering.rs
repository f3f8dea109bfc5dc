//! The per-frame cost of the metering path, as the proxy runs it: read the clock, scan and
//! classify the frame, update the ingress ledger, then stamp it into the egress ledger.
//! Run: `cargo bench --bench metering`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use metronome::format::Accounting;
use metronome::metering::clock::{FrameStamp, Tick};
use metronome::metering::ledger::EgressLedger;
use metronome::metering::meter::IngressMeter;
use metronome::metrics::{Buckets, Metrics, ModelLabels};
use metronome::scan::{Framing, Scanner, DEFAULT_MAX_EVENT_BYTES};

mod common;

fn bench(c: &mut Criterion) {
    let metrics = Arc::new(
        Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 32),
            Duration::from_millis(200),
        )
        .unwrap(),
    );
    let frames = common::vllm_chat_events(1_000);
    let mut group = c.benchmark_group("metering");
    group.throughput(Throughput::Elements(frames.len() as u64));
    group.bench_function("per_frame/scan+stamp+ledgers", |b| {
        b.iter(|| {
            let started = Tick::now();
            let mut meter = IngressMeter::new(
                Scanner::new(Framing::Sse, DEFAULT_MAX_EVENT_BYTES),
                Accounting::openai(),
                Default::default(),
                started,
                1024,
            );
            let mut egress = EgressLedger::default();
            for (seq, frame) in frames.iter().enumerate() {
                let at = Tick::now();
                let counts = meter.frame(black_box(frame), at, &metrics);
                let stamp = FrameStamp {
                    ingress: at,
                    events: counts.events,
                    token_events: counts.token_events,
                    mix: counts.mix,
                    seq: counts.seq,
                };
                egress.frame(at, seq as u64, &stamp, started, &metrics);
            }
            black_box(meter.ledger().counted_tokens)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
