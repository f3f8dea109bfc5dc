//! The comparison in a gate (`--assert 'errors==0'`) and in an objective (`--slo 'stalls==0'`):
//! one operator set, parsed and checked the same way for both, so what one accepts the other does.

use std::fmt;

/// How a value is compared with its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `<`
    Lt,
    /// `<=` (vllm bench's comparison for an objective)
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==` (for counts: `errors==0`, `stalls==0`)
    Eq,
}

/// The operators as written, longest first so that `<=` is not read as `<`.
const OPERATORS: [(&str, Cmp); 5] = [
    ("<=", Cmp::Le),
    (">=", Cmp::Ge),
    ("==", Cmp::Eq),
    ("<", Cmp::Lt),
    (">", Cmp::Gt),
];

// === impl Cmp ===

impl Cmp {
    /// Whether `value <cmp> bound`.
    pub fn holds(self, value: f64, bound: f64) -> bool {
        match self {
            Cmp::Lt => value < bound,
            Cmp::Le => value <= bound,
            Cmp::Gt => value > bound,
            Cmp::Ge => value >= bound,
            Cmp::Eq => value == bound,
        }
    }

    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        OPERATORS
            .iter()
            .find(|(_, cmp)| *cmp == self)
            .map_or("?", |(symbol, _)| symbol)
    }

    /// Splits `name<op>value` (spaces already removed) at its first operator: `None` when there
    /// is none, or a lone `=`.
    pub fn split(text: &str) -> Option<(&str, Cmp, &str)> {
        let at = text.find(['<', '>', '='])?;
        let (name, rest) = text.split_at(at);
        OPERATORS
            .iter()
            .find_map(|(op, cmp)| rest.strip_prefix(op).map(|value| (name, *cmp, value)))
    }
}

impl fmt::Display for Cmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_splits_at_its_longest_reading() {
        assert_eq!(Cmp::split("errors==0"), Some(("errors", Cmp::Eq, "0")));
        assert_eq!(
            Cmp::split("itl_p99<=250ms"),
            Some(("itl_p99", Cmp::Le, "250ms"))
        );
        assert_eq!(Cmp::split("tps_p50>=7"), Some(("tps_p50", Cmp::Ge, "7")));
        assert_eq!(Cmp::split("a<1"), Some(("a", Cmp::Lt, "1")));
        assert_eq!(Cmp::split("a>1"), Some(("a", Cmp::Gt, "1")));
        assert_eq!(Cmp::split("errors=0"), None);
        assert_eq!(Cmp::split("errors"), None);
    }

    #[test]
    fn equality_holds_only_for_the_same_value() {
        assert!(Cmp::Eq.holds(0.0, 0.0));
        assert!(!Cmp::Eq.holds(1.0, 0.0));
        assert!(Cmp::Le.holds(1.0, 1.0) && !Cmp::Lt.holds(1.0, 1.0));
        assert_eq!(Cmp::Ge.to_string(), ">=");
    }
}
