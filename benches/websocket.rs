//! The WebSocket frame reader's cost per message on a Responses-API delta (`response.output_text
//! .delta`, about 150 bytes, one text frame): from the server unmasked (a slice of the read),
//! from the client masked (unmasked into the reader's buffer), and compressed with
//! permessage-deflate, with and without context takeover; one message per read, and a stream
//! cut into 16 KiB reads. `tunnel_metering` is the whole per-message work of a metered tunnel:
//! the reader, the Responses accountant, the stream's ingress ledger and its egress stamp, one
//! delta per upstream read, as `proxy::tunnel::relay` runs it. Run: `cargo bench --bench
//! websocket`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use metronome::websocket::encode::{write_frame, Deflater, FrameSpec};
use metronome::websocket::{
    DeflateParams, Direction, FrameReader, Limits, Message, MessageSink, Opcode,
};

const MESSAGES: usize = 10_000;

/// Counts messages and their bytes, so nothing is optimised away.
struct Count(u64);

impl MessageSink for Count {
    fn on_message(&mut self, message: Message<'_>) {
        self.0 += message.data.len() as u64 + 1;
    }
}

/// `n` deltas as OpenAI's Responses API streams them.
fn deltas(n: usize) -> Vec<Vec<u8>> {
    let words = [
        " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ",", "\\n",
    ];
    (0..n)
        .map(|i| {
            format!(
                r#"{{"type":"response.output_text.delta","sequence_number":{},"item_id":"msg_67c9fa0d3e4881908fe8a3b2","output_index":0,"content_index":0,"delta":"{}","logprobs":[]}}"#,
                i + 4,
                words[i % words.len()]
            )
            .into_bytes()
        })
        .collect()
}

/// One frame per message: masked with `mask`, compressed by `deflater`.
fn frames(
    messages: &[Vec<u8>],
    mask: Option<[u8; 4]>,
    mut deflater: Option<Deflater>,
) -> Vec<Vec<u8>> {
    messages
        .iter()
        .map(|m| {
            let payload = deflater.as_mut().map(|d| d.compress(m));
            let spec = FrameSpec {
                opcode: Opcode::Text,
                fin: true,
                rsv1: payload.is_some(),
                mask,
            };
            let mut out = Vec::new();
            write_frame(&mut out, spec, payload.as_deref().unwrap_or(m));
            out
        })
        .collect()
}

fn read(direction: Direction, deflate: Option<DeflateParams>, reads: &[Vec<u8>]) -> u64 {
    let mut reader = FrameReader::new(direction, deflate, Limits::default());
    let mut sink = Count(0);
    for bytes in reads {
        reader.feed(black_box(bytes), &mut sink);
    }
    sink.0
}

/// One way a direction's messages arrive.
struct Case {
    name: &'static str,
    direction: Direction,
    deflate: Option<DeflateParams>,
    /// One frame per read.
    reads: Vec<Vec<u8>>,
}

fn bench(c: &mut Criterion) {
    let messages = deltas(MESSAGES);
    let no_takeover = DeflateParams {
        server_no_context_takeover: true,
        ..DeflateParams::default()
    };
    let cases = [
        Case {
            name: "server_unmasked",
            direction: Direction::ServerToClient,
            deflate: None,
            reads: frames(&messages, None, None),
        },
        Case {
            name: "client_masked",
            direction: Direction::ClientToServer,
            deflate: None,
            reads: frames(&messages, Some([0x37, 0xfa, 0x21, 0x3d]), None),
        },
        Case {
            name: "server_deflate",
            direction: Direction::ServerToClient,
            deflate: Some(DeflateParams::default()),
            reads: frames(&messages, None, Some(Deflater::new(true))),
        },
        Case {
            name: "server_deflate_no_takeover",
            direction: Direction::ServerToClient,
            deflate: Some(no_takeover),
            reads: frames(&messages, None, Some(Deflater::new(false))),
        },
    ];
    let mut group = c.benchmark_group("websocket_messages");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    for case in &cases {
        group.bench_function(format!("{}/message_per_read", case.name), |b| {
            b.iter(|| read(case.direction, case.deflate, &case.reads))
        });
        let cut: Vec<Vec<u8>> = case
            .reads
            .concat()
            .chunks(16 * 1024)
            .map(<[u8]>::to_vec)
            .collect();
        group.bench_function(format!("{}/16KiB_reads", case.name), |b| {
            b.iter(|| read(case.direction, case.deflate, &cut))
        });
    }
    group.finish();
}

/// A metered tunnel's meter on a Responses socket whose client asked for one response.
fn tunnel_meter() -> metronome::proxy::tunnel::metering::TunnelMeter {
    use metronome::proxy::tunnel::metering::{Api, Setup, TunnelMeter};
    let config = metronome::config::Config::from_toml("").expect("the default configuration");
    let state = std::sync::Arc::new(metronome::proxy::ProxyState::new(config).expect("state"));
    let mut meter = TunnelMeter::new(Setup {
        state,
        route: "bench".into(),
        api: Some(Api::Responses),
        extensions: metronome::websocket::Extensions::None,
        first_id: "0".repeat(32).into(),
        traceparent: None,
        request_id: None,
        line: Default::default(),
        think: Default::default(),
        query_model: None,
    });
    let create = frames(
        &[br#"{"type":"response.create","model":"m","input":"hi"}"#.to_vec()],
        Some([1, 2, 3, 4]),
        None,
    );
    meter.from_client(&create[0], metronome::metering::clock::Tick::now());
    meter
}

fn bench_tunnel(c: &mut Criterion) {
    use metronome::metering::clock::Tick;
    let reads = frames(&deltas(MESSAGES), None, None);
    let mut group = c.benchmark_group("tunnel_metering");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("server_unmasked/message_per_read", |b| {
        b.iter_batched(
            tunnel_meter,
            |mut meter| {
                for read in &reads {
                    meter.from_upstream(black_box(read), Tick::now());
                    meter.delivered(Tick::now());
                }
                meter
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench, bench_tunnel);
criterion_main!(benches);
