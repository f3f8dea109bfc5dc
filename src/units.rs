//! Durations as people write them on a command line and in config: `250ms`, `2s`, `1.5s`, `90us`,
//! `5m`, and the Go / Prometheus / Kubernetes spelling that chains units, `1m30s`, `1h`, `2h45m`.
//! One parser, so the sim's cadence flags, the probe's gates and the config all agree.

use std::time::Duration;

/// Parses one or more `<number><unit>` parts, largest unit first or not, with unit `ns`, `us`
/// (or `µs`), `ms`, `s`, `m` (or `min`), `h` or `d`: `250ms`, `1.5s`, `1m30s`, `1h`.
/// A bare number is refused: a duration without a unit is a bug waiting to happen.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an empty duration (write e.g. `250ms`, `2s` or `1m30s`)".to_string());
    }
    let mut seconds = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{text}` has no unit after its last number (write e.g. `250ms`, `2s` or `1m30s`)"))?;
        let (number, after) = rest.split_at(digits);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` has `{number}` where a number should be"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let seconds_per_unit = match unit.trim() {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            other => {
                return Err(format!(
                    "`{other}` in `{text}` is not a unit (use ns, us, ms, s, m, h or d)"
                ))
            }
        };
        seconds += value * seconds_per_unit;
        rest = next;
    }
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("`{text}` is not a valid duration"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is too long"))
}

/// Writes a duration compactly in the largest unit that keeps it readable (`850us`, `12.3ms`, `2.50s`).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2}s")
    } else if s >= 0.01 {
        format!("{:.1}ms", s * 1e3)
    } else if s >= 0.001 {
        format!("{:.2}ms", s * 1e3)
    } else {
        format!("{:.0}us", s * 1e6)
    }
}

/// Milliseconds, for unit tests' scripts that read like prose (tests/support has the same for
/// the integration tests).
#[cfg(test)]
pub(crate) const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("90us"), Ok(Duration::from_micros(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("250").unwrap_err().contains("no unit"));
        assert!(parse_duration("5 parsecs")
            .unwrap_err()
            .contains("not a unit"));
        assert!(parse_duration("ms").is_err());
    }

    #[test]
    fn go_prometheus_and_kubernetes_spellings_chain_units() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2h45m"), Ok(Duration::from_secs(9900)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("1m30").unwrap_err().contains("no unit"));
        assert!(parse_duration("1m 30x").unwrap_err().contains("not a unit"));
        assert!(parse_duration("").is_err());
    }

    proptest::proptest! {
        /// Any chain of whole hours, minutes, seconds and milliseconds reads back as their sum.
        #[test]
        fn chains_add_up(h in 0u64..48, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
            let got = parse_duration(&text).map_err(proptest::test_runner::TestCaseError::fail)?;
            proptest::prop_assert!(got.abs_diff(want) < Duration::from_micros(1), "{text}: {got:?}");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_duration(Duration::from_micros(850)), "850us");
        assert_eq!(format_duration(Duration::from_micros(12_340)), "12.3ms");
        assert_eq!(format_duration(Duration::from_millis(2500)), "2.50s");
    }
}
