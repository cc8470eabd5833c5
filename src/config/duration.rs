//! Durations written as in Kubernetes manifests: `500ms`, `60s`, `5m`, `1h`, or combined (`1m30s`).

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration read from and written to configuration as text like `1m30s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigDuration(Duration);

impl ConfigDuration {
    /// A whole number of seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// A whole number of milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Parses `500ms`, `60s`, `5m`, `2h` and concatenations such as `1m30s`.
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(DurationError::Empty);
        }
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return Err(DurationError::NotADuration(text.to_owned()));
            }
            let number: u64 = rest[..digits].parse().map_err(|_| DurationError::TooLarge(text.to_owned()))?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
            let part = match &rest[..unit_len] {
                "ms" => Duration::from_millis(number),
                "s" => Duration::from_secs(number),
                "m" => Duration::from_secs(number.saturating_mul(60)),
                "h" => Duration::from_secs(number.saturating_mul(3600)),
                "" => return Err(DurationError::NoUnit(text.to_owned())),
                other => return Err(DurationError::UnknownUnit { text: text.to_owned(), unit: other.to_owned() }),
            };
            total = total.saturating_add(part);
            rest = &rest[unit_len..];
        }
        Ok(Self(total))
    }
}

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing but blanks.
    #[error("an empty duration")]
    Empty,
    /// Something other than numbers and units.
    #[error("{0:?} is not a duration like 500ms, 60s, 5m or 1h")]
    NotADuration(String),
    /// A number past 64 bits.
    #[error("{0:?} has too large a number")]
    TooLarge(String),
    /// A number without a unit.
    #[error("{0:?} lacks a unit (ms, s, m or h)")]
    NoUnit(String),
    /// A unit that is none of ms, s, m, h.
    #[error("{text:?} has an unknown unit {unit:?} (use ms, s, m or h)")]
    UnknownUnit {
        /// The duration.
        text: String,
        /// Its unit.
        unit: String,
    },
}

impl fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if !millis.is_multiple_of(1000) { write!(f, "{millis}ms") } else { write!(f, "{}s", millis / 1000) }
    }
}

impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ConfigDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([0-9]+(ms|s|m|h))+$",
            "description": "A duration such as 500ms, 60s, 5m, 1h or 1m30s."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_combinations() {
        assert_eq!(ConfigDuration::parse("500ms").unwrap().get(), Duration::from_millis(500));
        assert_eq!(ConfigDuration::parse("60s").unwrap().get(), Duration::from_secs(60));
        assert_eq!(ConfigDuration::parse("5m").unwrap().get(), Duration::from_secs(300));
        assert_eq!(ConfigDuration::parse("1h").unwrap().get(), Duration::from_secs(3600));
        assert_eq!(ConfigDuration::parse("1m30s").unwrap().get(), Duration::from_secs(90));
    }

    #[test]
    fn refuses_what_is_not_a_duration_and_says_why() {
        assert!(ConfigDuration::parse("60").unwrap_err().to_string().contains("lacks a unit"));
        assert!(ConfigDuration::parse("5d").unwrap_err().to_string().contains("unknown unit"));
        assert!(ConfigDuration::parse("s").unwrap_err().to_string().contains("not a duration"));
        assert!(ConfigDuration::parse("").is_err());
    }

    #[test]
    fn display_round_trips() {
        for text in ["500ms", "1500ms", "60s", "300s", "0s"] {
            assert_eq!(ConfigDuration::parse(text).unwrap().to_string(), text);
        }
    }
}
