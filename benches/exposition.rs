//! `/metrics` encode time and size at 10,000 histogram series, in each format the admin listener
//! speaks: text 0.0.4 (classic buckets), OpenMetrics text (classic buckets, exemplars) and
//! Prometheus protobuf (classic and native buckets, exemplars).
//! Run: `cargo bench --bench exposition` (sizes are printed once, before the timings).
//! The encoders as they were before they wrote straight from the series
//! (`metronome::metrics::reference`) are timed in the same run, as `before/…`.
//! Profile one encode: `EXPOSITION_ONCE=text|openmetrics|protobuf` (or `before-text`, …) runs
//! only that encode, once, after building the registry (for `valgrind --tool=callgrind
//! --toggle-collect='*encode_as*'`, or `'*reference*encode*'` for the encoders before).
//!
//! For the choice between metronome's own family and encoders and the `prometheus-client` crate
//! (ARCHITECTURE.md), the same series are also built in a `prometheus-client` histogram family
//! and encoded with its OpenMetrics text encoder, and one sample's cost is timed both ways:
//! `prometheus-client` takes a lock per observation, metronome's stream adds to a local count.

use std::time::Duration;

use criterion::{black_box, criterion_group, Criterion};
use metronome::metrics::exposition::Format;
use metronome::metrics::reference;
use metronome::metrics::{Buckets, Exemplar, LocalHistogram, Metrics, ModelLabels, NativeCounts};

/// Series of the ITL family: 10 routes × 500 models × 2 points, phase `content`.
const SERIES: usize = 10_000;

/// Metrics whose ITL family has [`SERIES`] series, each merged from a stream of 200 gaps around
/// 30 ms with a stall (about 20 native buckets, an exemplar or two).
fn populated() -> Metrics {
    let metrics = Metrics::new(
        &Buckets::default(),
        ModelLabels::new(&[], 1_000),
        Duration::from_millis(200),
    )
    .unwrap();
    let index = metrics.itl.native().unwrap().clone();
    let bounds = metrics.itl.bounds().to_vec();
    let mut x: u64 = 7;
    for i in 0..SERIES {
        let (route, model, point) = (
            format!("route-{}", i % 10),
            format!("model-{}", (i / 10) % 500),
            if i / 5_000 == 0 { "ingress" } else { "egress" },
        );
        let mut local = LocalHistogram::default();
        let mut native = NativeCounts::default();
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let gap = 0.02 + (x % 20_000) as f64 * 1e-6;
            local.observe(&bounds, gap);
            native.observe(&index, gap);
        }
        local.observe(&bounds, 0.45);
        native.observe(&index, 0.45);
        let id = format!("{i:016x}");
        let exemplar = Exemplar {
            stream_id: &id,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            value: 0.45,
        };
        metrics.itl.merge_with(
            &[&route, &model, point, "content"],
            &local,
            &native,
            Some(&exemplar),
        );
    }
    metrics
}

/// The label set of the `prometheus-client` family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Labels {
    route: String,
    model: String,
    point: String,
    phase: String,
}

type ClientFamily = prometheus_client::metrics::family::Family<
    Labels,
    prometheus_client::metrics::histogram::Histogram,
    fn() -> prometheus_client::metrics::histogram::Histogram,
>;

fn itl_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(Buckets::default().itl)
}

/// The same series in a `prometheus-client` registry, each sample observed one at a time.
fn populated_client() -> (prometheus_client::registry::Registry, ClientFamily) {
    let mut registry = prometheus_client::registry::Registry::default();
    let family: ClientFamily = ClientFamily::new_with_constructor(itl_histogram);
    registry.register(
        "metronome_inter_token_latency_seconds",
        "Gap between consecutive token events",
        family.clone(),
    );
    let mut x: u64 = 7;
    for i in 0..SERIES {
        let labels = Labels {
            route: format!("route-{}", i % 10),
            model: format!("model-{}", (i / 10) % 500),
            point: if i / 5_000 == 0 { "ingress" } else { "egress" }.to_string(),
            phase: "content".to_string(),
        };
        let histogram = family.get_or_create(&labels);
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            histogram.observe(0.02 + (x % 20_000) as f64 * 1e-6);
        }
        histogram.observe(0.45);
    }
    (registry, family)
}

/// One of the encoders before, returning the exposition's size.
type Encoder = fn(&Metrics) -> usize;

fn bench(c: &mut Criterion) {
    let metrics = populated();
    let (client_registry, client_family) = populated_client();
    let encode_client = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &client_registry)
            .expect("encoding into a String");
        out
    };
    println!(
        "exposition/prometheus-client-openmetrics: {} bytes at {SERIES} ITL series",
        encode_client().len()
    );
    let formats = [
        ("text-0.0.4", Format::Text),
        ("openmetrics-1.0.0", Format::OpenMetrics),
        ("protobuf-delimited", Format::Protobuf),
    ];
    for (name, format) in formats {
        let bytes = metrics.encode_as(format).len();
        println!("exposition/{name}: {bytes} bytes at {SERIES} ITL series");
    }
    let mut group = c.benchmark_group("exposition");
    group.sample_size(10);
    for (name, format) in formats {
        group.bench_function(format!("{name}/10000-series"), |b| {
            b.iter(|| black_box(metrics.encode_as(format)).len())
        });
    }
    let before: [(&str, Encoder); 3] = [
        ("text-0.0.4", |m| reference::encode(m).len()),
        ("openmetrics-1.0.0", |m| {
            reference::encode_openmetrics(m).len()
        }),
        ("protobuf-delimited", |m| {
            reference::encode_protobuf(m).len()
        }),
    ];
    for (name, encode) in before {
        group.bench_function(format!("before/{name}/10000-series"), |b| {
            b.iter(|| encode(black_box(&metrics)))
        });
    }
    // What `/metrics` adds when the scraper accepts gzip (Prometheus does): the admin handler's
    // `flate2` at `Compression::fast()`, over the text body.
    let text = metrics.encode_as(Format::Text);
    group.bench_function("gzip-fast/text-0.0.4/10000-series", |b| {
        b.iter(|| {
            use std::io::Write as _;
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(text.len() / 8),
                flate2::Compression::fast(),
            );
            gz.write_all(black_box(&text)).expect("into a Vec");
            gz.finish().expect("into a Vec").len()
        })
    });
    group.bench_function("prometheus-client-openmetrics/10000-series", |b| {
        b.iter(|| black_box(encode_client()).len())
    });
    group.finish();

    // One sample: prometheus-client's observe on a series' handle (its lock), against what a
    // metronome stream does per gap (a classic bucket count and a native bucket count, local).
    let mut group = c.benchmark_group("observe");
    let handle = client_family.get_or_create(&Labels {
        route: "route-0".into(),
        model: "model-0".into(),
        point: "ingress".into(),
        phase: "content".into(),
    });
    let gaps: Vec<f64> = (0..1_000).map(|i| 0.02 + f64::from(i) * 2e-5).collect();
    group.throughput(criterion::Throughput::Elements(gaps.len() as u64));
    group.bench_function("prometheus-client/histogram.observe", |b| {
        b.iter(|| {
            for gap in &gaps {
                handle.observe(black_box(*gap));
            }
        })
    });
    let index = metrics.itl.native().unwrap().clone();
    let bounds = metrics.itl.bounds().to_vec();
    group.bench_function("metronome/local+native", |b| {
        let mut local = LocalHistogram::default();
        let mut native = NativeCounts::default();
        b.iter(|| {
            for gap in &gaps {
                local.observe(&bounds, black_box(*gap));
                native.observe(&index, black_box(*gap));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(which) = std::env::var("EXPOSITION_ONCE") {
        let metrics = populated();
        let bytes = match which.as_str() {
            "before-text" => reference::encode(&metrics).len(),
            "before-openmetrics" => reference::encode_openmetrics(&metrics).len(),
            "before-protobuf" => reference::encode_protobuf(&metrics).len(),
            "openmetrics" => metrics.encode_as(Format::OpenMetrics).len(),
            "protobuf" => metrics.encode_as(Format::Protobuf).len(),
            _ => metrics.encode_as(Format::Text).len(),
        };
        println!("{which}: {} bytes", black_box(bytes));
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
