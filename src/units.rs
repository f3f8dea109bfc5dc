//! Durations as people write them on a command line and in config: `250ms`, `2s`, `1.5s`, `90us`,
//! `5m`. One parser, so the sim's cadence flags, the probe's gates and the config all agree.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ns`, `us` (or `µs`), `ms`, `s`, `m` or `h`.
/// A bare number is refused: a duration without a unit is a bug waiting to happen.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit (write e.g. `250ms` or `2s`)"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number"))?;
    let seconds_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "`{other}` in `{text}` is not a unit (use ns, us, ms, s, m or h)"
            ))
        }
    };
    let seconds = value * seconds_per_unit;
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
    fn formatting() {
        assert_eq!(format_duration(Duration::from_micros(850)), "850us");
        assert_eq!(format_duration(Duration::from_micros(12_340)), "12.3ms");
        assert_eq!(format_duration(Duration::from_millis(2500)), "2.50s");
    }
}
