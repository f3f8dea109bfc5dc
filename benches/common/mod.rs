//! A realistic vLLM chat-completions stream, shared by the benchmarks.

/// `n` chunks exactly as vLLM's OpenAI server writes them (role chunk, content chunks, finish
/// chunk, usage chunk, `[DONE]`), one SSE event each.
pub fn vllm_chat_events(n: usize) -> Vec<Vec<u8>> {
    chat_events(n, false)
}

/// The same with `stream_options.continuous_usage_stats`: every content chunk also carries the
/// usage so far, so consecutive chunks differ outside their text (no chunk template applies).
#[allow(dead_code)] // the scanner benchmark's only
pub fn vllm_chat_events_with_usage(n: usize) -> Vec<Vec<u8>> {
    chat_events(n, true)
}

fn chat_events(n: usize, continuous_usage: bool) -> Vec<Vec<u8>> {
    let words = [
        " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ",", "\\n",
    ];
    let head = r#"data: {"id":"chatcmpl-b1c2d3e4f5a6","object":"chat.completion.chunk","created":1732800000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":"#;
    let mut events = vec![format!(
        r#"{head}{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}"#
    )];
    for i in 0..n {
        let usage = if continuous_usage {
            format!(
                r#","usage":{{"prompt_tokens":42,"total_tokens":{},"completion_tokens":{}}}"#,
                43 + i,
                i + 1
            )
        } else {
            String::new()
        };
        events.push(format!(
            r#"{head}{{"content":"{}"}},"logprobs":null,"finish_reason":null}}]{usage}}}"#,
            words[i % words.len()]
        ));
    }
    events.push(format!(
        r#"{head}{{}},"logprobs":null,"finish_reason":"stop"}}]}}"#
    ));
    events.push(format!(
        r#"data: {{"id":"chatcmpl-b1c2d3e4f5a6","object":"chat.completion.chunk","created":1732800000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{{"prompt_tokens":42,"completion_tokens":{n},"total_tokens":{}}}}}"#,
        n + 42
    ));
    events.push("data: [DONE]".to_string());
    events
        .into_iter()
        .map(|e| format!("{e}\n\n").into_bytes())
        .collect()
}
