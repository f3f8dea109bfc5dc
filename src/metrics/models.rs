//! The `model` label, kept bounded.
//!
//! A model name comes from the stream, that is from the network, so it cannot become a label
//! value unchecked: either an allow-list names the models, or the first N distinct names are
//! kept; everything else is `other`. Resolution happens once per stream.
//!
//! A name a person could misread is refused, that is labelled `other`, rather than mended: one
//! with a control, format, invisible or private-use character (a right-to-left override, a
//! zero-width space, a byte-order mark), a separator other than the space (U+2028, U+2029, a
//! no-break space), a space at either end, or the reserved values `other` and `unknown` in any
//! case. Removing the character would merge the name with the one it imitates (`gpt-4` and
//! `gpt-4` + U+200B), and replacing it would still show a look-alike of a real name; `other` says
//! plainly that the name is not shown. The label is then what every exposition, OTLP attribute,
//! log line and `/streams` field carries, so this one check covers them all.

use crate::poison::RwLockExt;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// The label of models outside the allow-list or beyond the cap.
pub const OTHER: &str = "other";
/// The label of streams that never named a model.
pub const UNKNOWN: &str = "unknown";
/// The longest model name kept as a label; a longer one is `other`.
const MAX_MODEL_LABEL_BYTES: usize = 128;

/// Maps model names seen in streams to bounded label values.
#[derive(Debug)]
pub struct ModelLabels {
    /// When set, exactly these names are labels.
    allow: Option<HashSet<Arc<str>>>,
    /// Otherwise, the first `cap` names seen.
    cap: usize,
    seen: RwLock<HashSet<Arc<str>>>,
    other: Arc<str>,
    unknown: Arc<str>,
}

// === impl ModelLabels ===

impl ModelLabels {
    /// Labels from an allow-list (when non-empty) or the first `cap` names seen.
    pub fn new(allow: &[String], cap: usize) -> Self {
        let allow =
            (!allow.is_empty()).then(|| allow.iter().map(|m| Arc::from(m.as_str())).collect());
        ModelLabels {
            allow,
            cap,
            seen: RwLock::new(HashSet::new()),
            other: Arc::from(OTHER),
            unknown: Arc::from(UNKNOWN),
        }
    }

    /// The label for a model name (`None`: the stream named no model).
    pub fn resolve(&self, model: Option<&str>) -> Arc<str> {
        let Some(model) = model.filter(|m| !m.is_empty()) else {
            return self.unknown.clone();
        };
        if refusal(model).is_some() {
            return self.other.clone();
        }
        if let Some(allow) = &self.allow {
            return allow
                .get(model)
                .cloned()
                .unwrap_or_else(|| self.other.clone());
        }
        if let Some(label) = self.seen.read_or_recover().get(model) {
            return label.clone();
        }
        let mut seen = self.seen.write_or_recover();
        if let Some(label) = seen.get(model) {
            return label.clone();
        }
        if seen.len() >= self.cap {
            return self.other.clone();
        }
        let label: Arc<str> = Arc::from(model);
        seen.insert(label.clone());
        label
    }
}

/// Why `name` cannot be a `model` label value, or `None` when it can (an allow-list entry is
/// checked with the same rule, so the configuration says why).
pub fn refusal(name: &str) -> Option<&'static str> {
    if name.len() > MAX_MODEL_LABEL_BYTES {
        Some("is longer than 128 bytes")
    } else if name.eq_ignore_ascii_case(OTHER) || name.eq_ignore_ascii_case(UNKNOWN) {
        Some("is reserved: metronome labels models it does not show `other`, and streams that name none `unknown`")
    } else if name.starts_with(' ') || name.ends_with(' ') {
        Some("begins or ends with a space")
    } else if has_misreadable(name) {
        Some("has a control, format, invisible, private-use or separator character")
    } else {
        None
    }
}

/// Whether `name` has a [`misreadable`] character. An ASCII name (nearly every model's) is
/// checked a byte at a time: of ASCII, only the controls are misreadable.
fn has_misreadable(name: &str) -> bool {
    if name.is_ascii() {
        name.bytes().any(|b| b.is_ascii_control())
    } else {
        name.chars().any(misreadable)
    }
}

/// A character that shows nothing, shows something else, or reorders what follows: the
/// controls (Cc), every white space but U+0020 (Zs, Zl, Zp and the other White_Space controls),
/// the format characters (Cf) and the rest of the default-ignorable code points (Unicode's
/// DerivedCoreProperties), the private-use planes and the noncharacters.
fn misreadable(c: char) -> bool {
    if c.is_control() || (c != ' ' && c.is_whitespace()) {
        return true;
    }
    let c = u32::from(c);
    c & 0xFFFE == 0xFFFE
        || MISREADABLE
            .binary_search_by(|&(low, high)| {
                if high < c {
                    std::cmp::Ordering::Less
                } else if low > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
}

/// Sorted ranges of format (Cf), default-ignorable, private-use (Co) and noncharacter code
/// points not caught by `char::is_control` and `char::is_whitespace` (Unicode 16).
const MISREADABLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),    // soft hyphen
    (0x034F, 0x034F),    // combining grapheme joiner
    (0x0600, 0x0605),    // Arabic number signs
    (0x061C, 0x061C),    // Arabic letter mark
    (0x06DD, 0x06DD),    // Arabic end of ayah
    (0x070F, 0x070F),    // Syriac abbreviation mark
    (0x0890, 0x0891),    // Arabic pound and piastre marks above
    (0x08E2, 0x08E2),    // Arabic disputed end of ayah
    (0x115F, 0x1160),    // Hangul fillers
    (0x17B4, 0x17B5),    // Khmer inherent vowels
    (0x180B, 0x180F),    // Mongolian variation selectors and vowel separator
    (0x200B, 0x200F),    // zero-width space, joiners, LRM, RLM
    (0x202A, 0x202E),    // bidirectional embeddings and overrides
    (0x2060, 0x206F),    // word joiner, invisible operators, bidirectional isolates
    (0x3164, 0x3164),    // Hangul filler
    (0xE000, 0xF8FF),    // private use
    (0xFDD0, 0xFDEF),    // noncharacters
    (0xFE00, 0xFE0F),    // variation selectors
    (0xFEFF, 0xFEFF),    // byte-order mark
    (0xFFA0, 0xFFA0),    // halfwidth Hangul filler
    (0xFFF0, 0xFFFB),    // interlinear annotations and reserved specials
    (0x110BD, 0x110BD),  // Kaithi number sign
    (0x110CD, 0x110CD),  // Kaithi number sign above
    (0x13430, 0x1343F),  // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  // shorthand format controls
    (0x1D173, 0x1D17A),  // musical symbol format controls
    (0xE0000, 0xE0FFF),  // tags and variation selectors supplement
    (0xF0000, 0x10FFFF), // supplementary private use
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_n_then_other() {
        let labels = ModelLabels::new(&[], 2);
        assert_eq!(&*labels.resolve(Some("a")), "a");
        assert_eq!(&*labels.resolve(Some("b")), "b");
        assert_eq!(&*labels.resolve(Some("c")), OTHER);
        assert_eq!(&*labels.resolve(Some("a")), "a");
        assert_eq!(&*labels.resolve(None), UNKNOWN);
    }

    #[test]
    fn misreadable_and_reserved_names_are_labelled_other_and_take_no_place() {
        let labels = ModelLabels::new(&[], 1);
        for hostile in [
            "gpt\u{202e}4",
            "gpt-4\u{200b}",
            "\u{feff}llama",
            "line\u{2028}break",
            "para\u{2029}break",
            "no\u{a0}break",
            "ideographic\u{3000}space",
            "del\u{7f}",
            "next-line\u{85}",
            "soft\u{ad}hyphen",
            "isolate\u{2066}",
            "tag\u{e0041}",
            "private\u{e000}",
            "nonchar\u{fffe}",
            "selector\u{fe0f}",
            " padded",
            "padded ",
            "other",
            "unknown",
            "Other",
            "UNKNOWN",
        ] {
            assert_eq!(&*labels.resolve(Some(hostile)), OTHER, "{hostile:?}");
        }
        // None of them took the one place: a clean name still gets it.
        assert_eq!(
            &*labels.resolve(Some("meta-llama/Llama-3.1-8B")),
            "meta-llama/Llama-3.1-8B"
        );
        for clean in [
            "qwen2.5:7b",
            "claude-3-5-sonnet@20240620",
            "Mistral 7B",
            "通义千问",
            "modèle",
        ] {
            assert_eq!(refusal(clean), None, "{clean}");
        }
    }

    #[test]
    fn the_table_is_sorted_and_its_ranges_do_not_overlap() {
        for pair in MISREADABLE.windows(2) {
            assert!(pair[0].0 <= pair[0].1 && pair[0].1 < pair[1].0, "{pair:x?}");
        }
    }

    #[test]
    fn allow_list() {
        let labels = ModelLabels::new(&["llama".to_string()], 100);
        assert_eq!(&*labels.resolve(Some("llama")), "llama");
        assert_eq!(&*labels.resolve(Some("mistral")), OTHER);
    }

    #[test]
    fn every_ascii_character_is_judged_as_the_table_judges_it() {
        for b in 0u8..=127 {
            let name = format!("m{}", char::from(b));
            assert_eq!(
                has_misreadable(&name),
                name.chars().any(misreadable),
                "{b:#04x}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn property_the_ascii_reading_agrees_with_the_table(name in "\\PC{0,12}|[\\x00-\\x7f]{0,12}") {
            proptest::prop_assert_eq!(has_misreadable(&name), name.chars().any(misreadable));
        }
    }
}
