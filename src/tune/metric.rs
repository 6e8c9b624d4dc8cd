//! Throughput from a command's output: the last match of `--metric REGEX` (one
//! capture group), or by default the last "<number> img/s" (samples/s,
//! tokens/s, it/s, ...) anywhere in the output.

use regex::Regex;

/// The default: a number followed by a per-second unit.
pub const DEFAULT_METRIC: &str = r"(?i)([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*((?:img|imgs|images|samples|sample|tokens|tok|it|examples|seq|sequences|steps)/s)\b";

#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("--metric {pattern:?} is not a valid regex: {why}")]
    Invalid { pattern: String, why: String },
    #[error("--metric {pattern:?} must have exactly one capture group (it has {groups})")]
    Groups { pattern: String, groups: usize },
}

/// A compiled metric pattern.
#[derive(Debug, Clone)]
pub struct Metric {
    re: Regex,
    /// The default pattern also captures the unit (group 2).
    default: bool,
}

impl Metric {
    pub fn new(pattern: Option<&str>) -> Result<Metric, MetricError> {
        let default = pattern.is_none();
        let pattern = pattern.unwrap_or(DEFAULT_METRIC);
        let re = Regex::new(pattern).map_err(|e| MetricError::Invalid {
            pattern: pattern.to_string(),
            why: e.to_string(),
        })?;
        let groups = re.captures_len() - 1;
        if !default && groups != 1 {
            return Err(MetricError::Groups {
                pattern: pattern.to_string(),
                groups,
            });
        }
        Ok(Metric { re, default })
    }

    /// The value one line reports (the last match in it), with the unit the
    /// default pattern captures ("img/s").
    pub fn scan(&self, rank: usize, line: &str) -> Option<Hit> {
        let caps = self.re.captures_iter(line).last()?;
        let value = caps
            .get(1)?
            .as_str()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())?;
        let unit = if self.default {
            caps.get(2).map(|u| u.as_str().to_string())
        } else {
            None
        };
        let mut text = line.trim().to_string();
        if text.len() > MAX_HIT_TEXT {
            let mut cut = MAX_HIT_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        Some(Hit {
            value,
            unit,
            rank,
            line: text,
        })
    }

    /// The last value in these lines (of rank 0).
    pub fn find(&self, lines: &[String]) -> Option<f64> {
        self.last(lines).map(|h| h.value)
    }

    /// The last hit in these lines (of rank 0).
    pub fn last(&self, lines: &[String]) -> Option<Hit> {
        lines.iter().rev().find_map(|l| self.scan(0, l))
    }
}

/// Report at most this much of the line a value came from.
const MAX_HIT_TEXT: usize = 300;

/// Where a throughput value came from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hit {
    pub value: f64,
    pub unit: Option<String>,
    /// The local rank that printed it.
    pub rank: usize,
    /// The line, trimmed (at most 300 bytes).
    pub line: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn default_forms() {
        let m = Metric::new(None).unwrap();
        for (line, want) in [
            ("throughput: 123.4 img/s", 123.4),
            ("epoch 1: 98 samples/s", 98.0),
            ("1.5e3 tokens/s", 1500.0),
            ("step 3 | 12.5it/s", 12.5),
            ("[rank 0] 7 images/s", 7.0),
        ] {
            assert_eq!(m.find(&lines(&[line])), Some(want), "{line}");
        }
        assert_eq!(
            m.find(&lines(&["10 img/s", "loss 3", "20 img/s, later 30 img/s"])),
            Some(30.0)
        );
        assert_eq!(m.find(&lines(&["no numbers here", "3 imgs"])), None);
        let hit = m.last(&lines(&["9 samples/s"])).unwrap();
        assert_eq!((hit.value, hit.unit.as_deref()), (9.0, Some("samples/s")));
        assert_eq!(hit.line, "9 samples/s");
    }

    #[test]
    fn custom_pattern() {
        let m = Metric::new(Some(r"speed=(\d+)")).unwrap();
        assert_eq!(m.find(&lines(&["speed=42 x"])), Some(42.0));
        assert!(matches!(
            Metric::new(Some("(a)(b)")),
            Err(MetricError::Groups { groups: 2, .. })
        ));
        assert!(matches!(
            Metric::new(Some("no group")),
            Err(MetricError::Groups { groups: 0, .. })
        ));
        assert!(matches!(
            Metric::new(Some("(")),
            Err(MetricError::Invalid { .. })
        ));
    }
}
