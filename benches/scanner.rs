//! Scanner throughput on a realistic vLLM chat stream: the SSE scanner alone, and the scanner
//! with OpenAI token accounting, for one event per frame (how vLLM writes) and 16 KiB frames
//! (how a buffering edge re-chunks). Run: `cargo bench --bench scanner`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use metronome::format::Accounting;
use metronome::scan::{Event, EventSink, Framing, Scanner, DEFAULT_MAX_EVENT_BYTES};

mod common;

struct Count(u64);
impl EventSink for Count {
    fn on_event(&mut self, event: Event<'_>) {
        self.0 += event.data.len() as u64 + 1;
    }
}

struct Classify(Accounting, u64);
impl EventSink for Classify {
    fn on_event(&mut self, event: Event<'_>) {
        if self.0.classify(&event).token_event {
            self.1 += 1;
        }
    }
}

fn frames_of(events: &[Vec<u8>], size: Option<usize>) -> Vec<Vec<u8>> {
    match size {
        None => events.to_vec(),
        Some(size) => events.concat().chunks(size).map(<[u8]>::to_vec).collect(),
    }
}

/// Scans `frames` as one stream and classifies every event as the OpenAI accountant; returns the
/// token events found.
fn classify_all(frames: &[Vec<u8>]) -> u64 {
    let mut scanner = Scanner::new(Framing::Sse, DEFAULT_MAX_EVENT_BYTES);
    let mut sink = Classify(Accounting::openai(), 0);
    for f in frames {
        scanner.feed(black_box(f), &mut sink);
    }
    sink.1
}

fn bench(c: &mut Criterion) {
    let events = common::vllm_chat_events(10_000);
    let bytes: usize = events.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group("scanner");
    group.throughput(Throughput::Bytes(bytes as u64));
    for (name, size) in [("event_per_frame", None), ("16KiB_frames", Some(16 * 1024))] {
        let frames = frames_of(&events, size);
        group.bench_function(format!("sse/{name}"), |b| {
            b.iter(|| {
                let mut scanner = Scanner::new(Framing::Sse, DEFAULT_MAX_EVENT_BYTES);
                let mut sink = Count(0);
                for f in &frames {
                    scanner.feed(black_box(f), &mut sink);
                }
                sink.0
            })
        });
        group.bench_function(format!("sse+openai/{name}"), |b| {
            b.iter(|| assert_eq!(classify_all(&frames), 10_000))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("scanner_events");
    group.throughput(Throughput::Elements(events.len() as u64));
    let frames = frames_of(&events, None);
    group.bench_function("sse+openai/event_per_frame", |b| {
        b.iter(|| classify_all(&frames))
    });
    // Every chunk differs outside its text (the usage grows): each one is walked.
    let walked = frames_of(&common::vllm_chat_events_with_usage(10_000), None);
    group.bench_function("sse+openai/continuous_usage", |b| {
        b.iter(|| assert_eq!(classify_all(&walked), 10_000))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
