//! The batch detector's memory is O(active streams) plus bounded rings: 2,000 streams
//! held open through their probes, each with token events and a hitch, cost a bounded amount of
//! heap each, and once they end what is left is the rings' bound, whatever came before.
//!
//! A counting allocator measures the live heap of the whole test process exactly (in the style
//! of tests/memory.rs, which reads the resident set; the detector's share is too small for
//! that), so this file is its own test binary with a single test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metronome::batch::{BatchDetector, BatchSettings};
use metronome::config::Upstream;
use metronome::format::PhaseMix;
use metronome::metering::clock::Tick;
use metronome::metrics::{Buckets, Metrics, ModelLabels};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const STREAMS: usize = 2_000;
const KB: i64 = 1024;

fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_streams_cost_bounded_heap_and_leave_only_the_rings() {
    let metrics = Arc::new(
        Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 8),
            Duration::from_millis(500),
        )
        .unwrap(),
    );
    let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
    let detector = BatchDetector::new(BatchSettings::default(), metrics, &upstream).unwrap();
    let ids: Vec<Arc<str>> = (0..STREAMS)
        .map(|i| Arc::from(format!("s{i:05}")))
        .collect();
    let route: Arc<str> = Arc::from("chat");
    let model: Arc<str> = Arc::from("m");
    // Token times a few seconds in the past: 30 events 20 ms apart, then every stream waits
    // 400 ms (a hitch of the whole batch), then 10 more.
    let base = Tick::from_instant(Instant::now() - Duration::from_secs(5));
    let at = |k: u64| base.saturating_add(Duration::from_millis(20 * k));

    let before = live();
    let mut probes = Vec::with_capacity(STREAMS);
    for id in &ids {
        let probe = detector.open(
            &upstream,
            id.clone(),
            None,
            route.clone(),
            base,
            Some(4_000),
        );
        probes.push(probe.expect("the detector is on by default"));
    }
    for probe in &mut probes {
        for k in 0..30 {
            probe.token_events(at(k), 1, PhaseMix::ALL_CONTENT, Some(&model));
        }
        for k in 50..60 {
            probe.token_events(at(k), 1, PhaseMix::ALL_CONTENT, Some(&model));
        }
    }
    // Let the sweep settle the hitches (two sweeps after their end, long past).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = live() - before;
    let per_stream = held / STREAMS as i64;
    eprintln!(
        "{STREAMS} streams held: {} KiB of heap, {per_stream} bytes each",
        held / KB
    );
    assert!(per_stream < 1_024, "{per_stream} bytes per stream");
    let hitches = detector.hitches_of("s00007");
    assert_eq!(hitches.len(), 1, "{hitches:?}");
    assert_eq!(hitches[0].event, 30);

    drop(probes);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = live() - before;
    eprintln!("after they ended: {} KiB of heap left", left / KB);
    // The arrivals (256), episodes (64) and hitch marks (8,192) rings, at most.
    assert!(left < 1_536 * KB, "{} KiB left", left / KB);
    let episodes = detector.episodes();
    assert!(
        !episodes.is_empty() && episodes.len() <= 65,
        "{}",
        episodes.len()
    );
    assert!(episodes.iter().all(|(_, e)| e.stream_ids.len() <= 64));
}
