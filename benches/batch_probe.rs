//! The batch detector's per-frame cost (issue 29): `StreamProbe::token_events` on a steady stream
//! (one token event per frame, 20 ms apart, no hitch), as the metered body calls it once per
//! frame. No runtime, so no sweep runs: this is the frame's share alone.
//! Run: `cargo bench --bench batch_probe`; exact instructions per frame under callgrind:
//! `valgrind --tool=callgrind BENCH --bench --test` and the inclusive count of `Bencher::iter`
//! divided by 1,000.

use std::sync::Arc;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use metronome::batch::{BatchDetector, BatchSettings};
use metronome::config::Upstream;
use metronome::format::PhaseMix;
use metronome::metering::clock::Tick;
use metronome::metrics::{Buckets, Metrics, ModelLabels};

/// Frames per iteration.
const FRAMES: u64 = 1_000;

fn bench(c: &mut Criterion) {
    let metrics = Arc::new(
        Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 32),
            Duration::from_millis(200),
        )
        .unwrap(),
    );
    let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
    let detector = BatchDetector::new(BatchSettings::default(), metrics, &upstream).unwrap();
    let start = Tick::now();
    let mut probe = detector
        .open(
            &upstream,
            Arc::from("s"),
            None,
            Arc::from("chat"),
            start,
            None,
        )
        .unwrap();
    let model: Arc<str> = Arc::from("m");
    let mut k = 0u64;
    let mut group = c.benchmark_group("batch");
    group.throughput(Throughput::Elements(FRAMES));
    group.bench_function("per_frame/probe", |b| {
        b.iter(|| {
            for _ in 0..FRAMES {
                k += 1;
                let at = start.saturating_add(Duration::from_millis(20 * k));
                probe.token_events(black_box(at), 1, PhaseMix::ALL_CONTENT, Some(&model));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
