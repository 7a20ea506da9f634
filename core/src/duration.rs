//! Durations as people write them in config files and flags: `250ms`, `5s`, `1.5m`, `1h`. The
//! sidecar's config and the routing table it writes use the same text, so that a setting keeps
//! one name and one form from the operator's file to the filter.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; the number may have a fraction.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => return Err(format!("{text:?} has no unit (use ms, s, m or h, e.g. \"5s\")")),
        other => return Err(format!("{text:?}: unknown unit {other:?} (use ms, s, m or h)")),
    };
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration like \"5s\""))?;
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("{text:?} is out of range"))
}

/// The shortest of the forms [`parse`] reads back to the same value, for logs, help texts and
/// the routing table.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        // Below a millisecond: a fraction of one, which `parse` rounds to the nanosecond.
        format!("{}ms", d.as_nanos() as f64 / 1e6)
    } else if ms % 1000 != 0 || ms == 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

/// A [`Duration`] as its text in serde (`#[serde(with = "crate::duration::text")]`).
pub mod text {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::parse(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert!(parse("5").unwrap_err().contains("no unit"));
        assert!(parse("5d").unwrap_err().contains("unknown unit"));
        assert!(parse("s").is_err());
        assert!(parse("1.2.3s").is_err());
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format(Duration::from_secs(30)), "30s");
        for d in [
            Duration::ZERO,
            Duration::from_micros(1500),
            Duration::from_nanos(1),
            Duration::from_millis(61_001),
        ] {
            assert_eq!(parse(&format(d)), Ok(d), "{d:?}");
        }
    }
}
