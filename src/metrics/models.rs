//! The `model` label, kept bounded.
//!
//! A model name comes from the stream, that is from the network, so it cannot become a label
//! value unchecked: either an allow-list names the models, or the first N distinct names are
//! kept; everything else is `other`. Resolution happens once per stream.

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
        if model.len() > MAX_MODEL_LABEL_BYTES || !model.chars().all(|c| !c.is_control()) {
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
    fn allow_list() {
        let labels = ModelLabels::new(&["llama".to_string()], 100);
        assert_eq!(&*labels.resolve(Some("llama")), "llama");
        assert_eq!(&*labels.resolve(Some("mistral")), OTHER);
    }
}
