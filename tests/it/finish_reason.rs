//! Why streams ended and how many tokens they used, through one proxy: recorded streams of five
//! APIs (each on a route of its own, each from a scripted upstream of its own) and a client that
//! goes away mid-stream. `metronome_streams_total{finish_reason}` counts each reason exactly, the
//! proxy's own view (a client gone is `abort`) wins over the body's, and
//! `metronome_request_tokens{type}` holds one input sample per stream whose usage reported one and
//! one output sample per stream, in the semconv buckets.

use crate::support;

use bytes::Bytes;
use http_body_util::BodyExt;
use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use support::fixtures::Fixture;
use support::*;

const STREAMS: &str = "metronome_streams_total";
const COUNT: &str = "metronome_request_tokens_count";
const SUM: &str = "metronome_request_tokens_sum";
const BUCKET: &str = "metronome_request_tokens_bucket";

/// The recorded streams: (fixture, route name).
const RECORDED: [(&str, &str); 5] = [
    ("tgi_v1_chat.sse", "tgi-openai"),
    ("anthropic_messages.sse", "anthropic"),
    ("ollama_chat.ndjson", "ollama"),
    ("gemini_stream.sse", "gemini"),
    ("llamacpp_completion.sse", "llamacpp"),
];

/// A client that reads a few frames of a long chat stream and goes away.
async fn abandon_a_chat_stream(proxy: &ProxyHandle) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .body(http_body_util::Full::new(Bytes::from("{}")))
        .unwrap();
    let mut body = client.request(req).await.unwrap().into_body();
    for _ in 0..5 {
        body.frame().await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn finish_reasons_and_token_usage_of_several_apis_are_counted_exactly() {
    let long_chat = Upstream::openai_chat()
        .tokens(200)
        .every(ms(50))
        .start()
        .await;
    let mut tables = String::new();
    let mut upstreams = Vec::new();
    for (i, (file, route)) in RECORDED.iter().enumerate() {
        let fixture = Fixture::named(file);
        let body = Bytes::from(fixture.bytes());
        let upstream = Upstream::script(fixture.content_type, vec![Step::Frame(ms(0), body)])
            .start()
            .await;
        tables.push_str(&format!(
            "[[routes]]\nname = \"{route}\"\npath = \"/r{i}{}\"\nmatch = \"exact\"\nupstream = \"http://{}\"\nformat = \"{}\"\n",
            fixture.path.split('?').next().unwrap(),
            upstream.addr,
            fixture.format,
        ));
        upstreams.push(upstream);
    }
    let config = Config::from_toml(&format!("{}{tables}", proxy_toml(long_chat.addr))).unwrap();
    let proxy = ProxyHandle::start(config).await.unwrap();

    for (i, (file, _)) in RECORDED.iter().enumerate() {
        let fixture = Fixture::named(file);
        let path = format!("/r{i}{}", fixture.path);
        let got = request(proxy.proxy_addr, "POST", &path, r#"{"stream":true}"#, false).await;
        assert!(got.error.is_none(), "{file}: {:?}", got.error);
        assert_eq!(got.bytes(), fixture.bytes(), "{file}");
    }
    abandon_a_chat_stream(&proxy).await;
    long_chat
        .wait_for_a_cancel("the abandoned stream's upstream was never let go")
        .await;

    let m = scrape_until(&proxy, |m| m.value(STREAMS, &[]) == 6.0).await;
    let reason = |r: &str| m.value(STREAMS, &[("finish_reason", r)]);
    assert_eq!(
        reason("length"),
        1.0,
        "TGI's OpenAI route ran out of tokens\n{}",
        m.0
    );
    assert_eq!(reason("tool_calls"), 1.0, "Anthropic's tool_use");
    assert_eq!(
        reason("stop"),
        3.0,
        "Ollama's stop, Gemini's STOP, llama.cpp's eos"
    );
    assert_eq!(reason("abort"), 1.0, "the client went away");
    assert_eq!(
        m.value(
            STREAMS,
            &[
                ("route", "chat"),
                ("outcome", "client_cancelled"),
                ("finish_reason", "abort")
            ]
        ),
        1.0
    );
    assert_eq!(reason("none") + reason("error") + reason("other"), 0.0);

    // Input: one sample per recorded stream (the abandoned one never got its usage chunk).
    let input = [("type", "input")];
    let prompts: Vec<u64> = RECORDED
        .iter()
        .map(|(file, _)| {
            Fixture::named(file)
                .prompt_tokens
                .expect("a usage with the prompt")
        })
        .collect();
    assert_eq!(prompts, [12, 472, 31, 9, 6]);
    assert_eq!(m.value(COUNT, &input), 5.0);
    assert_eq!(m.value(SUM, &input), 530.0);
    assert_eq!(
        m.value("metronome_prompt_tokens_total", &[]),
        530.0,
        "the histogram's sum is the counter's total"
    );
    for (le, below) in [
        ("4", 0.0),
        ("16", 3.0),
        ("64", 4.0),
        ("256", 4.0),
        ("1024", 5.0),
    ] {
        assert_eq!(
            m.value(BUCKET, &[input[0], ("le", le)]),
            below,
            "input le={le}"
        );
    }
    assert_eq!(
        m.value(COUNT, &[input[0], ("route", "chat")]),
        0.0,
        "no usage, no input sample"
    );

    // Output: one sample per stream, the recorded ones exactly as their usage or count says.
    for (file, route) in RECORDED {
        let at = [("type", "output"), ("route", route)];
        let tokens = Fixture::named(file).tokens.0 as f64;
        assert_eq!(m.value(COUNT, &at), 1.0, "{file}");
        assert_eq!(m.value(SUM, &at), tokens, "{file}");
    }
    let abandoned = [("type", "output"), ("route", "chat")];
    assert_eq!(m.value(COUNT, &abandoned), 1.0);
    let counted = m.value(SUM, &abandoned);
    assert!(
        (4.0..200.0).contains(&counted),
        "the abandoned stream's tokens so far: {counted}"
    );
    assert_eq!(m.value(COUNT, &[("type", "output")]), 6.0);
    proxy.shutdown().await;
}
