//! Which names and attributes a family is exported under.

/// How the families are named on export.
#[derive(Debug, Clone, Default)]
pub struct Naming {
    _private: (),
}

/// One family as it is exported: its name, unit and which series and labels it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Renamed {
    /// The exported metric name.
    pub name: String,
    /// The UCUM unit (`s`, `{token}`, empty for a plain ratio or count).
    pub unit: &'static str,
}

// === impl Naming ===

impl Naming {
    /// metronome's own names, as `/metrics` has them.
    pub fn metronome() -> Self {
        Naming::default()
    }

    /// The schema URL of the scope (empty: metronome's names follow no semconv version).
    pub fn schema_url(&self) -> &str {
        ""
    }

    /// The names a histogram family is exported under.
    pub fn histogram(&self, family: &str) -> Vec<Renamed> {
        vec![Renamed::same(family)]
    }

    /// The names a counter or gauge family is exported under.
    pub fn scalar(&self, family: &str) -> Vec<Renamed> {
        vec![Renamed::same(family)]
    }
}

// === impl Renamed ===

impl Renamed {
    /// The family under its own name, its unit read off the name's suffix.
    pub fn same(family: &str) -> Self {
        Renamed {
            name: family.to_string(),
            unit: unit_of(family),
        }
    }

    /// Whether a series with `labels` is exported under this name.
    pub fn keeps(&self, _labels: &[(String, String)]) -> bool {
        true
    }

    /// The attributes of a series with `labels`.
    pub fn attributes<'a>(&self, labels: &'a [(String, String)]) -> Vec<(&'a str, String)> {
        labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect()
    }
}

/// The UCUM unit a Prometheus name's suffix says.
fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_seconds") {
        "s"
    } else if name.ends_with("_tokens_total") || name.ends_with("tokens_per_event") {
        "{token}"
    } else {
        ""
    }
}
