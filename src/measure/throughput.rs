//! Throughput from a command's output: by default the rates real clients
//! print, read by the rules in `rates.rs`; with `--metric REGEX` (one capture
//! group) the last match of that pattern. Either way the line a value came
//! from is kept, so a report can show what was measured.

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::rates;

#[derive(Debug, thiserror::Error)]
pub(crate) enum MetricError {
    #[error("--metric {pattern:?} is not a valid regex: {why}")]
    Invalid { pattern: String, why: String },
    #[error("--metric {pattern:?} must have exactly one capture group (it has {groups})")]
    Groups { pattern: String, groups: usize },
}

/// How to read the throughput.
#[derive(Debug, Clone)]
pub(crate) struct Metric {
    /// None: the default rules.
    re: Option<Regex>,
}

/// What a value counts, for choosing among several (work beats steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HitKind {
    /// it/s, steps/s: the last resort.
    Steps,
    /// images, samples, tokens... per second.
    Work,
    /// The canonical line `threadwise: throughput=<N> <unit>`: beats any
    /// other rate the output prints.
    Canonical,
    /// `--metric`: whatever the user's pattern matches.
    Custom,
}

/// Report at most this much of the line a value came from.
const MAX_HIT_TEXT: usize = 300;

/// Where a throughput value came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hit {
    pub value: f64,
    /// img/s, samples/s, tokens/s, it/s ... (None for --metric).
    pub unit: Option<String>,
    pub kind: HitKind,
    /// The local rank that printed it.
    pub rank: usize,
    /// The line, trimmed (at most 300 bytes; a bar's last update).
    pub line: String,
}

impl Hit {
    /// Whether this later hit replaces `earlier`: the last of the best kind.
    pub(crate) fn replaces(&self, earlier: &Hit) -> bool {
        self.kind >= earlier.kind
    }

    /// Keep `self` in `best` if it replaces what is there.
    pub(crate) fn keep_in(self, best: &std::sync::Mutex<Option<Hit>>) {
        let mut best = best.lock().unwrap_or_else(|e| e.into_inner());
        if best.as_ref().is_none_or(|b| self.replaces(b)) {
            *best = Some(self);
        }
    }
}

fn shown(line: &str) -> String {
    let last = line
        .rsplit('\r')
        .find(|s| !s.trim().is_empty())
        .unwrap_or(line);
    let mut text = last.trim().to_string();
    if text.len() > MAX_HIT_TEXT {
        let mut cut = MAX_HIT_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

impl Metric {
    pub(crate) fn new(pattern: Option<&str>) -> Result<Metric, MetricError> {
        let Some(pattern) = pattern else {
            return Ok(Metric { re: None });
        };
        let re = Regex::new(pattern).map_err(|e| MetricError::Invalid {
            pattern: pattern.to_string(),
            why: e.to_string(),
        })?;
        let groups = re.captures_len() - 1;
        if groups != 1 {
            return Err(MetricError::Groups {
                pattern: pattern.to_string(),
                groups,
            });
        }
        Ok(Metric { re: Some(re) })
    }

    /// The user's pattern (`--metric`), None for the default rules.
    pub(crate) fn pattern(&self) -> Option<&str> {
        self.re.as_ref().map(Regex::as_str)
    }

    /// The value one line reports, if any.
    pub(crate) fn scan(&self, rank: usize, line: &str) -> Option<Hit> {
        let (value, unit, kind) = match &self.re {
            None if line.contains(rates::CANONICAL) => {
                let (value, unit) = rates::canonical(line)?;
                (value, Some(unit.to_string()), HitKind::Canonical)
            }
            None => {
                let r = rates::line_rate(line)?;
                let kind = match r.kind {
                    rates::Kind::Work => HitKind::Work,
                    rates::Kind::Steps => HitKind::Steps,
                };
                (r.value, Some(r.unit.to_string()), kind)
            }
            Some(re) => {
                let caps = re.captures_iter(line).last()?;
                let v = caps.get(1)?.as_str().trim().parse::<f64>().ok();
                (v.filter(|v| v.is_finite())?, None, HitKind::Custom)
            }
        };
        Some(Hit {
            value,
            unit,
            kind,
            rank,
            line: shown(line),
        })
    }

    /// The hit these lines (of rank 0) report: the last of the best kind
    /// (what tune's streaming sink keeps, for the tests).
    #[cfg(test)]
    pub(crate) fn last(&self, lines: &[String]) -> Option<Hit> {
        let mut best: Option<Hit> = None;
        for l in lines {
            if let Some(h) = self.scan(0, l)
                && best.as_ref().is_none_or(|b| h.replaces(b))
            {
                best = Some(h);
            }
        }
        best
    }

    /// The value of `last`.
    #[cfg(test)]
    pub(crate) fn find(&self, lines: &[String]) -> Option<f64> {
        self.last(lines).map(|h| h.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn across_lines_the_last_of_the_best_kind() {
        let m = Metric::new(None).unwrap();
        assert_eq!(
            m.find(&lines(&["10 img/s", "loss 3", "20 img/s, later 30 img/s"])),
            Some(20.0),
            "in a line the first, across lines the last"
        );
        // The HF Trainer: tqdm's it/s all along, samples/s at the end; and
        // a later it/s line does not win back.
        let hf = lines(&[
            " 50%|#####     | 15/30 [00:05<00:05,  2.71it/s]",
            "{'train_runtime': 12.3, 'train_samples_per_second': 41.5, 'train_steps_per_second': 2.6}",
            "100%|##########| 30/30 [00:12<00:00,  2.44it/s]",
        ]);
        let h = m.last(&hf).unwrap();
        assert_eq!(
            (h.value, h.unit.as_deref(), h.kind),
            (41.5, Some("samples/s"), HitKind::Work)
        );
        assert!(h.line.contains("train_samples_per_second"));
        assert_eq!(m.find(&lines(&["no numbers here", "3 imgs"])), None);
    }

    #[test]
    fn the_canonical_line_wins_over_every_other_rate() {
        let m = Metric::new(None).unwrap();
        let out = lines(&[
            "threadwise: throughput=50.5 img/s",
            "{'train_samples_per_second': 41.5}",
            "100%|##########| 30/30 [00:12<00:00,  2.44it/s]",
        ]);
        let h = m.last(&out).unwrap();
        assert_eq!(
            (h.value, h.unit.as_deref(), h.kind),
            (50.5, Some("img/s"), HitKind::Canonical)
        );
        // A near miss of the canonical line is no rate at all, even where the
        // heuristics would read one (`12img/s` is no unit of its own).
        assert_eq!(m.find(&lines(&["threadwise: throughput=12img/s"])), None);
        // With --metric the user's pattern decides, canonical line or not.
        let custom = Metric::new(Some(r"loss=(\d+)")).unwrap();
        let out = lines(&["threadwise: throughput=50 img/s loss=3"]);
        assert_eq!(custom.find(&out), Some(3.0));
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
