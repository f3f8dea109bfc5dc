//! Borrowed JSON helpers the accountants share.
//!
//! Every accountant deserializes an event into a small struct of borrowed fields: `&RawValue` for
//! strings (their raw text, so nothing is unescaped or copied), plain numbers and booleans, and
//! visitor-folded summaries for arrays. Fields an accountant does not name are skipped by serde
//! without allocating. These helpers answer the few questions every format asks of such fields.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The text of a JSON string that has no escapes, without its quotes: a model name as a label.
/// A name with escapes is rare enough to go unnamed rather than be unescaped into a new string.
pub(crate) fn plain_string(raw: &RawValue) -> Option<&str> {
    let text = raw.get();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// A JSON value that is a non-empty string: output the reader sees.
pub(crate) fn non_empty_string(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| {
        let text = r.get();
        text.len() > 2 && text.starts_with('"')
    })
}

/// The raw inside of a non-empty JSON string (escapes and all, without its quotes): a content
/// event's text lent to the no-parser `<think>` shape.
pub(crate) fn string_inside(raw: Option<&RawValue>) -> Option<&[u8]> {
    let text = raw.filter(|r| non_empty_string(Some(r)))?.get().as_bytes();
    Some(&text[1..text.len() - 1])
}

/// The length of a JSON string's raw (escaped) text, quotes excluded; 0 for anything else.
///
/// Escaping is per character, so the raw text of a string's prefix is a prefix of the string's
/// raw text: comparing raw lengths tells whether a cumulative text grew without unescaping it.
pub(crate) fn raw_string_len(raw: Option<&RawValue>) -> usize {
    raw.map(RawValue::get)
        .filter(|text| text.starts_with('"'))
        .map_or(0, |text| text.len().saturating_sub(2))
}

/// A field that is present and not `null` (an `error` object, a `generated_text`).
pub(crate) fn present(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| r.get() != "null")
}

/// A raw JSON value equal to the string literal `expected` (quotes included in `expected`).
pub(crate) fn is_literal(raw: Option<&RawValue>, expected: &str) -> bool {
    raw.is_some_and(|r| r.get() == expected)
}

/// How many elements a JSON array has, counted while skipping them: `token_ids`, where the
/// length is the exact number of tokens and the values do not matter. `null` counts as absent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArrayLen(pub Option<u32>);

impl<'de> Deserialize<'de> for ArrayLen {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LenVisitor;
        impl<'de> Visitor<'de> for LenVisitor {
            type Value = ArrayLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ArrayLen(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut n: u32 = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n = n.saturating_add(1);
                }
                Ok(ArrayLen(Some(n)))
            }
        }
        deserializer.deserialize_any(LenVisitor)
    }
}

/// `base` changed by `edits` for the readers' property tests: each `(at, op, piece)` inserts
/// `pieces[piece]` at byte `at` (op 0), deletes one to eight bytes there (op 1, as many as the piece's index modulo 8, plus one) or replaces one
/// character there with the piece (op 2), at character boundaries, positions taken modulo the
/// length.
#[cfg(test)]
pub(crate) fn edited(base: &str, edits: &[(usize, usize, usize)], pieces: &[&str]) -> String {
    let mut data = base.to_string();
    for &(at, op, index) in edits {
        let piece = pieces[index % pieces.len()];
        let mut at = at % (data.len() + 1);
        while !data.is_char_boundary(at) {
            at -= 1;
        }
        let reach = if op % 3 == 1 { 1 + index % 8 } else { 1 };
        let mut end = (at + reach).min(data.len());
        while !data.is_char_boundary(end) {
            end += 1;
        }
        match op % 3 {
            0 => data.insert_str(at, piece),
            1 => data.replace_range(at..end, ""),
            _ => data.replace_range(at..end, piece),
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn strings_are_read_without_unescaping() {
        assert_eq!(plain_string(raw(r#""llama3.2""#)), Some("llama3.2"));
        assert_eq!(plain_string(raw(r#""a\"b""#)), None);
        assert_eq!(plain_string(raw("3")), None);
        assert!(non_empty_string(Some(raw(r#""x""#))));
        assert!(!non_empty_string(Some(raw(r#""""#))));
        assert!(!non_empty_string(Some(raw("null"))));
        assert!(!non_empty_string(None));
        assert_eq!(raw_string_len(Some(raw(r#""a\nb""#))), 4);
        assert_eq!(raw_string_len(Some(raw("[1]"))), 0);
        assert!(present(Some(raw("{}"))));
        assert!(!present(Some(raw("null"))));
        assert!(is_literal(Some(raw(r#""error""#)), r#""error""#));
    }

    #[test]
    fn array_length_is_counted_and_null_is_absent() {
        #[derive(Deserialize)]
        struct Ids {
            #[serde(default)]
            ids: ArrayLen,
        }
        let ids = |text: &str| serde_json::from_str::<Ids>(text).unwrap().ids.0;
        assert_eq!(ids(r#"{"ids":[1,2,[3],{"a":4}]}"#), Some(4));
        assert_eq!(ids(r#"{"ids":[]}"#), Some(0));
        assert_eq!(ids(r#"{"ids":null}"#), None);
        assert_eq!(ids("{}"), None);
    }
}
