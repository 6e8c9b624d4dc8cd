//! The default throughput reader: the rates real training clients print, in
//! their own shapes, without ever taking a number that belongs to another key.
//!
//! Rules (also in docs/tune.md):
//! 1. A rate is either a rate key with its value (`img/s: 52.3`, `img/s=116.4`,
//!    `'train_samples_per_second': 41.5`, `train_samples_per_second =  41.5`,
//!    `RunningAvgSamplesPerSec=27.9`), or a number directly followed by a rate
//!    unit (`123.4 img/s`, `5.62it/s`, `520.12/s`), or tqdm's slow form
//!    `1.53s/it` (read as 1/1.53 = 0.654 it/s).
//! 2. A number that is itself the value of another key (`workers=4`, `lr: 0.1`)
//!    is never a rate, even when a unit follows it (`workers=4 img/s=116.4`).
//! 3. Work rates (images, samples, examples, sequences, tokens) win over step
//!    rates (it/s, steps/s, batches/s) in a line and across the output: the
//!    Trainer's `train_samples_per_second` wins over tqdm's `it/s`.
//! 4. In a line, the first rate of the winning kind counts (timm and DeepSpeed
//!    print the current rate before the average); across lines, the last.
//! 5. Carriage returns split a line like newlines (tqdm and Lightning bars).
//! 6. Above all of these: the canonical line a script prints to remove all
//!    doubt, `threadwise: throughput=<N> <unit>` (the Python helper's
//!    `threadwise.report()`, and the built-in workload), read before any
//!    heuristic and winning over every other rate in the output.

/// What a rate counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// it/s, steps/s, batches/s.
    Steps,
    /// images, samples, examples, sequences, tokens per second.
    Work,
}

/// One rate found in a line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rate {
    pub value: f64,
    /// Normalised unit: img/s, samples/s, tokens/s, seq/s, examples/s, it/s, steps/s.
    pub unit: &'static str,
    pub kind: Kind,
}

/// A rate word (before `/s`, or in `X_per_second`, `XPerSec`) and its unit.
fn unit_of(word: &str) -> Option<(&'static str, Kind)> {
    let w = word.to_ascii_lowercase();
    let w = w
        .trim_start_matches("train_")
        .trim_start_matches("eval_")
        .trim_start_matches("runningavg")
        .trim_start_matches("curr");
    Some(match w {
        "img" | "imgs" | "image" | "images" => ("img/s", Kind::Work),
        "sample" | "samples" | "" => ("samples/s", Kind::Work),
        "example" | "examples" => ("examples/s", Kind::Work),
        "seq" | "seqs" | "sequence" | "sequences" => ("seq/s", Kind::Work),
        "tok" | "toks" | "token" | "tokens" => ("tokens/s", Kind::Work),
        "it" | "its" | "iter" | "iters" | "iteration" | "iterations" => ("it/s", Kind::Steps),
        "step" | "steps" | "batch" | "batches" => ("steps/s", Kind::Steps),
        _ => return None,
    })
}

/// The canonical line's marker: `threadwise: throughput=<N> <unit>`.
pub const CANONICAL: &str = "threadwise: throughput=";

/// A figure line's marker: `threadwise: figure <name>=<N>`, a number a
/// client reports beside its throughput (the built-in workload's feeder
/// delays); `tune` keeps global rank 0's last of each name per trial.
pub const FIGURE: &str = "threadwise: figure ";

/// The longest name a figure may have.
const MAX_FIGURE_NAME: usize = 40;

/// The name and value of a figure line: a name of lowercase letters, digits
/// and `_`, `=`, a finite number; anything else is no figure.
pub(crate) fn figure(line: &str) -> Option<(&str, f64)> {
    let rest = &line[line.rfind(FIGURE)? + FIGURE.len()..];
    let (name, value) = rest.trim_end().split_once('=')?;
    let good = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || name.len() > MAX_FIGURE_NAME || !name.chars().all(good) {
        return None;
    }
    let (v, len) = number(value)?;
    (len == value.len() && v.is_finite()).then_some((name, v))
}

/// The longest unit a canonical line may name.
const MAX_UNIT: usize = 32;

/// The value and unit of a canonical line (rule 6), wherever in the line the
/// marker stands (after a logger's prefix, say); within `\r` updates, the
/// last. The unit is one word of at most 32 characters, taken as written.
pub(crate) fn canonical(line: &str) -> Option<(f64, &str)> {
    line.rsplit('\r').find_map(|seg| {
        let at = seg.rfind(CANONICAL)?;
        let rest = &seg[at + CANONICAL.len()..];
        let (value, len) = number(rest)?;
        let after = &rest[len..];
        let unit = after.strip_prefix(' ')?.trim_start_matches(' ');
        let unit = unit.split_whitespace().next()?;
        (unit.len() <= MAX_UNIT && value.is_finite() && value >= 0.0).then_some((value, unit))
    })
}

/// A number at the start of `s`: (value, length).
fn number(s: &str) -> Option<(f64, usize)> {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    };
    let int = digits(&mut i);
    let mut frac = false;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        frac = digits(&mut i);
    }
    if !int && !frac {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        let start = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > start {
            i = j;
        }
    }
    s[..i].parse().ok().map(|v| (v, i))
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'/' || c == b'-' || c == b'.'
}

/// The key a value at `pos` belongs to, when `line[..pos]` ends in `KEY:` or
/// `KEY=` (spaces and quotes allowed around, and one opening quote before the
/// value: transformers 5 prints `'train_samples_per_second': '393.6'`): the
/// key's text.
fn key_before(line: &str, pos: usize) -> Option<&str> {
    let b = line.as_bytes();
    let mut i = pos;
    if i > 0 && (b[i - 1] == b'\'' || b[i - 1] == b'"') {
        i -= 1;
    }
    while i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    if i == 0 || (b[i - 1] != b':' && b[i - 1] != b'=') {
        return None;
    }
    i -= 1;
    while i > 0 && (b[i - 1] == b' ' || b[i - 1] == b'\'' || b[i - 1] == b'"') {
        i -= 1;
    }
    let end = i;
    while i > 0 && is_word(b[i - 1]) {
        i -= 1;
    }
    (i < end).then(|| &line[i..end])
}

/// A rate key: `img/s`, `samples_per_second`, `SamplesPerSec`, `throughput`.
fn rate_key(key: &str) -> Option<(&'static str, Kind)> {
    let k = key.trim_end_matches(['\'', '"']);
    let lower = k.to_ascii_lowercase();
    if let Some(w) = lower.strip_suffix("/s") {
        return unit_of(w);
    }
    if let Some(w) = lower.strip_suffix("_per_second") {
        return unit_of(w);
    }
    if let Some(w) = lower.strip_suffix("persec") {
        return unit_of(w);
    }
    None
}

/// The unit right after a number: ` img/s`, `it/s`, `/s`, or `s/it` (slow form).
fn unit_after(rest: &str) -> Option<(&'static str, Kind, bool, usize)> {
    let trimmed = rest.trim_start_matches(' ');
    let skip = rest.len() - trimmed.len();
    if skip > 1 {
        return None;
    }
    let b = trimmed.as_bytes();
    let mut i = 0;
    while i < b.len() && (b[i].is_ascii_alphabetic() || b[i] == b'_') {
        i += 1;
    }
    let word = &trimmed[..i];
    let tail = &trimmed[i..];
    let end_ok = |n: usize| {
        tail.as_bytes()
            .get(n)
            .is_none_or(|c| !c.is_ascii_alphanumeric())
    };
    if tail.starts_with("/s") && end_ok(2) {
        let (unit, kind) = unit_of(word)?;
        return Some((unit, kind, false, skip + i + 2));
    }
    // tqdm's slow form: seconds per iteration.
    if (word == "s") && skip == 0 {
        let unit_tail = tail.strip_prefix('/')?;
        let j = unit_tail
            .bytes()
            .take_while(|c| c.is_ascii_alphabetic())
            .count();
        let (unit, kind) = unit_of(&unit_tail[..j])?;
        return Some((unit, kind, true, skip + i + 1 + j));
    }
    None
}

/// Every rate in one line (without carriage returns), in order.
pub(crate) fn rates_in(line: &str) -> Vec<Rate> {
    let mut out = vec![];
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts_number = (b[i].is_ascii_digit()
            || (b[i] == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
            && (i == 0 || !is_word(b[i - 1]));
        if !starts_number {
            i += 1;
            continue;
        }
        let Some((value, len)) = number(&line[i..]) else {
            i += 1;
            continue;
        };
        // A rate key before the value, or a unit right after it; a unit that
        // is itself a key (`4 img/s=116.4`: `img/s=` starts the next pair) is
        // not this number's, and then rule 2 leaves the number alone.
        let keyed = key_before(line, i).and_then(rate_key);
        let found = keyed.map(|(u, kind)| (u, kind, false)).or_else(|| {
            let rest = &line[i + len..];
            let (u, kind, inv, used) = unit_after(rest)?;
            let next = rest[used..].trim_start_matches(' ');
            (!next.starts_with([':', '='])).then_some((u, kind, inv))
        });
        if let Some((unit, kind, inverse)) = found {
            let value = if inverse { 1.0 / value } else { value };
            if value.is_finite() && value > 0.0 {
                out.push(Rate { value, unit, kind });
            }
        }
        i += len.max(1);
    }
    out
}

/// The rate a line reports (rules 3-5 within a line): the first of the best kind.
pub(crate) fn line_rate(line: &str) -> Option<Rate> {
    let all: Vec<Rate> = line.split('\r').flat_map(rates_in).collect();
    let best = all.iter().map(|r| r.kind).max()?;
    // Within \r-separated updates the last counts; within one segment the first.
    line.rsplit('\r')
        .find_map(|seg| rates_in(seg).into_iter().find(|r| r.kind == best))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_lines_and_their_near_misses() {
        assert_eq!(
            figure("threadwise: figure feeder_p99_us=412"),
            Some(("feeder_p99_us", 412.0))
        );
        assert_eq!(
            figure("[rank 0] threadwise: figure x=1.5\n"),
            Some(("x", 1.5))
        );
        for miss in [
            "threadwise: figure Feeder=1",
            "threadwise: figure a b=1",
            "threadwise: figure a=1 us",
            "threadwise: figure a=",
            "threadwise: figure =3",
            "threadwise: figure a=nan",
            "figure a=1",
        ] {
            assert_eq!(figure(miss), None, "{miss}");
        }
    }

    /// (line, value, unit) for every shape real clients print, and their near misses.
    const SHAPES: &[(&str, Option<(f64, &str)>)] = &[
        // torchvision reference scripts (MetricLogger)
        (
            "Epoch: [0]  [ 40/391]  eta: 0:01:02  lr: 0.1  img/s: 52.3  loss: 6.91 (6.93)",
            Some((52.3, "img/s")),
        ),
        ("lr: 0.1  img/s: 22.22", Some((22.22, "img/s"))),
        // key=value scripts
        ("step=40 img/s=116.4 loss=2.3", Some((116.4, "img/s"))),
        ("threads=1 workers=4 img/s=116.4", Some((116.4, "img/s"))),
        // Hugging Face Trainer, both forms
        (
            "{'train_runtime': 12.3, 'train_samples_per_second': 41.5, 'train_steps_per_second': 2.6, 'train_loss': 0.7, 'epoch': 1.0}",
            Some((41.5, "samples/s")),
        ),
        (
            "  train_samples_per_second =     41.5",
            Some((41.5, "samples/s")),
        ),
        (
            "  train_steps_per_second   =      2.6",
            Some((2.6, "steps/s")),
        ),
        // tqdm / Lightning bars (carriage returns)
        (
            "Epoch 0: 100%|██████████| 30/30 [00:05<00:00,  5.62it/s, v_num=0]",
            Some((5.62, "it/s")),
        ),
        (
            "\rEpoch 0:  50%|█████     | 15/30 [00:03<00:03,  4.90it/s]\rEpoch 0: 100%|██████████| 30/30 [00:05<00:00,  5.62it/s, v_num=0]",
            Some((5.62, "it/s")),
        ),
        (
            " 10%|█         | 3/30 [00:04<00:41,  1.53s/it]",
            Some((1.0 / 1.53, "it/s")),
        ),
        // DeepSpeed
        (
            "[Rank 0] epoch=0|step=40|RunningAvgSamplesPerSec=27.9, CurrSamplesPerSec=28.3, MemAllocated=1.2GB",
            Some((27.9, "samples/s")),
        ),
        // timm train.py
        (
            "Train: 0 [  40/390 ( 10%)]  Loss: 6.92 (6.94)  Time: 0.123s,  520.12/s  (0.130s,  492.01/s)  LR: 1.000e-05  Data: 0.010 (0.012)",
            Some((520.12, "samples/s")),
        ),
        // ours and most blog scripts
        ("throughput: 123.4 img/s", Some((123.4, "img/s"))),
        ("1.5e3 tokens/s", Some((1500.0, "tokens/s"))),
        ("[rank 0] 7 images/s", Some((7.0, "img/s"))),
        ("epoch 1: 98 samples/s", Some((98.0, "samples/s"))),
        // near misses: no rate at all
        ("workers=4", None),
        ("lr: 0.1 loss: 2.3", None),
        ("eta: 0:01:02 time: 0.123s", None),
        ("3 imgs", None),
        ("bandwidth 12 GB/s", None),
        ("version 2.1/s390x", None),
        ("workers=4 img/s: n/a", None),
        ("lr: 0.1 img/s: 22.22", Some((22.22, "img/s"))),
        ("speed=12.5 it/s", Some((12.5, "it/s"))),
        // transformers 5 quotes every value of its end-of-training line
        (
            "{'train_runtime': '0.1626', 'train_samples_per_second': '393.6', 'train_steps_per_second': '49.2', 'train_loss': '0.6934', 'epoch': '1'}",
            Some((393.6, "samples/s")),
        ),
        (
            r#"{"train_samples_per_second": "393.6", "train_steps_per_second": "49.2"}"#,
            Some((393.6, "samples/s")),
        ),
        (
            "{'train_steps_per_second': '49.2'}",
            Some((49.2, "steps/s")),
        ),
        // its near misses: quoted values of other keys, quoted non-numbers
        ("{'train_runtime': '0.1626', 'epoch': '1'}", None),
        ("{'train_samples_per_second': 'n/a'}", None),
        ("{'train_loss': '0.6934'} 'x' '3'", None),
    ];

    #[test]
    fn every_client_shape_and_its_near_misses() {
        for (line, want) in SHAPES {
            let got = line_rate(line).map(|r| (r.value, r.unit));
            match (got, want) {
                (Some((v, u)), Some((wv, wu))) => {
                    assert!(
                        (v - wv).abs() < 1e-9 && u == *wu,
                        "{line:?}: got {v} {u}, want {wv} {wu}"
                    )
                }
                (g, w) => assert_eq!(g, w.map(|(v, u)| (v, u)), "{line:?}"),
            }
        }
    }

    #[test]
    fn the_canonical_line_and_its_near_misses() {
        let cases: &[(&str, Option<(f64, &str)>)] = &[
            (
                "threadwise: throughput=393.6 samples/s",
                Some((393.6, "samples/s")),
            ),
            (
                "threadwise: throughput=1234567.0 img/s",
                Some((1234567.0, "img/s")),
            ),
            (
                "threadwise: throughput=1.5e3 tokens/s",
                Some((1500.0, "tokens/s")),
            ),
            ("threadwise: throughput=0.0 img/s", Some((0.0, "img/s"))),
            (
                "INFO:root:threadwise: throughput=12 img/s",
                Some((12.0, "img/s")),
            ),
            (
                "threadwise: throughput=12 img/s  (world 2)",
                Some((12.0, "img/s")),
            ),
            (
                "x\rthreadwise: throughput=1 img/s\rthreadwise: throughput=2 img/s",
                Some((2.0, "img/s")),
            ),
            // near misses: no value, no unit, glued unit, a non-number, a unit too long
            ("threadwise: throughput=", None),
            ("threadwise: throughput=12", None),
            ("threadwise: throughput=12img/s", None),
            ("threadwise: throughput=abc img/s", None),
            ("threadwise: throughput=-3 img/s", None),
            ("threadwise: throughput = 12 img/s", None),
            ("threadwise: throughput=nan img/s", None),
            (
                "threadwise: throughput=12 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/s",
                None,
            ),
            ("threadwise throughput=12 img/s", None),
        ];
        for (line, want) in cases {
            assert_eq!(canonical(line), *want, "{line:?}");
        }
    }

    #[test]
    fn work_wins_over_steps_in_a_line() {
        let r = line_rate("12.5 it/s, 400 samples/s").unwrap();
        assert_eq!((r.value, r.unit), (400.0, "samples/s"));
    }
}
