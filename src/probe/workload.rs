//! The shape of the workload: what each request asks for. A synthetic prompt of about N tokens
//! (`--input-tokens`), an exact output length (`--output-tokens`, with `ignore_eos` as vllm bench
//! sends it) and a dataset of one request per line (`--dataset FILE.jsonl`).
//!
//! The bodies are all built before the run, so a stream only picks one by index: nothing is
//! parsed or serialized while streams are timed.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::args::RequestArgs;

/// Words that are one token each in the common tokenizers (GPT, Llama, Qwen), cycled to make a
/// prompt of about N tokens.
const WORDS: [&str; 16] = [
    "the", "time", "of", "a", "song", "is", "kept", "by", "one", "steady", "beat", "and", "every",
    "note", "falls", "on",
];

/// How many output tokens each request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLength {
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Whether to send `ignore_eos: true`, so the server generates exactly `max_tokens`.
    pub ignore_eos: bool,
}

/// What each request asks for, as `meta.workload` records it: two reports whose shapes differ
/// measured different work, which `--baseline` and `probe compare` warn about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestShape {
    /// The `max_tokens` of the default request (`null` with `--body`).
    pub max_tokens: Option<u32>,
    /// Whether `ignore_eos` was sent (`--output-tokens`), so every stream is that long.
    pub ignore_eos: bool,
    /// `--input-tokens`: the synthetic prompt's length (`null` without).
    pub input_tokens: Option<u32>,
    /// `--dataset`'s file name (`null` without; the file name only, as paths differ between
    /// machines).
    pub dataset: Option<String>,
    /// `--body`'s file name (`null` without).
    pub body: Option<String>,
}

// === impl RequestShape ===

impl RequestShape {
    /// The shape the command line asks for, with `output` its output length.
    pub fn of(request: &RequestArgs, output: OutputLength) -> Self {
        let file_name = |path: &Path| path.file_name().map(|n| n.to_string_lossy().into_owned());
        let custom_body = request.body.is_some();
        RequestShape {
            max_tokens: (!custom_body).then_some(output.max_tokens),
            ignore_eos: !custom_body && output.ignore_eos,
            input_tokens: request.input_tokens.filter(|_| !custom_body),
            dataset: request.dataset.as_deref().and_then(file_name),
            body: request.body.as_deref().and_then(file_name),
        }
    }
}

/// A `--dataset` file that cannot be used: a usage error.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be read.
    #[error("cannot read the dataset {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file has no non-empty line.
    #[error("the dataset {0} has no request (one request body or prompt per line)")]
    Empty(PathBuf),
}

/// A prompt of about `tokens` tokens: `tokens` one-token words separated by spaces.
pub fn synthetic_prompt(tokens: u32) -> String {
    let mut prompt = String::with_capacity(tokens as usize * 6);
    for i in 0..tokens as usize {
        if i > 0 {
            prompt.push(' ');
        }
        prompt.push_str(WORDS[i % WORDS.len()]);
    }
    prompt
}

/// The default request: an OpenAI chat completion with streaming and a final usage chunk, so the
/// output-token count is exact where the server supports `stream_options`.
pub fn chat_request(model: &str, prompt: &str, output: OutputLength) -> Bytes {
    let mut body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": prompt }],
        "stream": true,
        "max_tokens": output.max_tokens,
        "stream_options": { "include_usage": true },
    });
    if output.ignore_eos {
        body["ignore_eos"] = Value::Bool(true);
    }
    Bytes::from(body.to_string())
}

/// Reads a dataset: one request per non-empty line. A line that is a JSON object is a request
/// body: `model` is filled in when missing, `stream` is set to true, and `--output-tokens`
/// overrides its `max_tokens`. Any other line (a JSON string, or plain text) is a prompt for the
/// default chat request.
pub fn read_dataset(
    path: &Path,
    model: &str,
    output: OutputLength,
    output_given: bool,
) -> Result<Vec<Bytes>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let bodies: Vec<Bytes> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(object)) => request_from_object(object, model, output, output_given),
            Ok(Value::String(prompt)) => chat_request(model, &prompt, output),
            _ => chat_request(model, line, output),
        })
        .collect();
    if bodies.is_empty() {
        return Err(DatasetError::Empty(path.to_owned()));
    }
    Ok(bodies)
}

fn request_from_object(
    mut object: Map<String, Value>,
    model: &str,
    output: OutputLength,
    output_given: bool,
) -> Bytes {
    object
        .entry("model")
        .or_insert_with(|| Value::String(model.to_owned()));
    object.insert("stream".to_owned(), Value::Bool(true));
    if output_given {
        object.insert("max_tokens".to_owned(), json!(output.max_tokens));
        if output.ignore_eos {
            object.insert("ignore_eos".to_owned(), Value::Bool(true));
        }
    }
    Bytes::from(Value::Object(object).to_string())
}

/// Which body stream `index` sends: in order (cycling), or drawn at random from `seed`.
pub fn pick(index: u64, count: usize, seed: Option<u64>) -> usize {
    if count <= 1 {
        return 0;
    }
    let n = count as u64;
    match seed {
        None => (index % n) as usize,
        // SplitMix64 of (seed, index): reproducible, independent of which task runs first.
        Some(seed) => (splitmix64(seed ^ splitmix64(index)) % n) as usize,
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXACT: OutputLength = OutputLength {
        max_tokens: 32,
        ignore_eos: true,
    };

    #[test]
    fn synthetic_prompts_have_the_asked_number_of_words() {
        assert_eq!(synthetic_prompt(0), "");
        assert_eq!(synthetic_prompt(3), "the time of");
        assert_eq!(synthetic_prompt(1000).split(' ').count(), 1000);
    }

    #[test]
    fn exact_output_sends_ignore_eos() {
        let body: Value = serde_json::from_slice(&chat_request("m", "hi", EXACT)).unwrap();
        assert_eq!(body["max_tokens"], 32);
        assert_eq!(body["ignore_eos"], true);
        let plain = OutputLength {
            max_tokens: 64,
            ignore_eos: false,
        };
        let body: Value = serde_json::from_slice(&chat_request("m", "hi", plain)).unwrap();
        assert!(body.get("ignore_eos").is_none());
    }

    #[test]
    fn dataset_lines_are_bodies_or_prompts() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":5}\n\n\
             \"a quoted prompt\"\nplain text prompt\n{\"model\":\"other\",\"prompt\":\"x\"}\n",
        )
        .unwrap();
        let bodies = read_dataset(file.path(), "m", EXACT, false).unwrap();
        let parsed: Vec<Value> = bodies
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect();
        assert_eq!(parsed.len(), 4);
        assert_eq!(parsed[0]["model"], "m");
        assert_eq!(parsed[0]["stream"], true);
        assert_eq!(parsed[0]["max_tokens"], 5);
        assert_eq!(parsed[1]["messages"][0]["content"], "a quoted prompt");
        assert_eq!(parsed[2]["messages"][0]["content"], "plain text prompt");
        assert_eq!(parsed[3]["model"], "other");
        let forced = read_dataset(file.path(), "m", EXACT, true).unwrap();
        let first: Value = serde_json::from_slice(&forced[0]).unwrap();
        assert_eq!(
            (first["max_tokens"].as_u64(), first["ignore_eos"].as_bool()),
            (Some(32), Some(true))
        );

        let empty = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(empty.path(), "\n  \n").unwrap();
        assert!(matches!(
            read_dataset(empty.path(), "m", EXACT, false),
            Err(DatasetError::Empty(_))
        ));
    }

    #[test]
    fn picks_cycle_in_order_or_repeat_from_a_seed() {
        let in_order: Vec<usize> = (0..6).map(|i| pick(i, 4, None)).collect();
        assert_eq!(in_order, [0, 1, 2, 3, 0, 1]);
        let a: Vec<usize> = (0..50).map(|i| pick(i, 4, Some(7))).collect();
        let b: Vec<usize> = (0..50).map(|i| pick(i, 4, Some(7))).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&k| k < 4));
        // Every line is drawn at some point, and not in order.
        assert!((0..4).all(|k| a.contains(&k)));
        assert_ne!(a[..6], in_order[..]);
        assert_eq!(pick(9, 1, Some(3)), 0);
    }
}
