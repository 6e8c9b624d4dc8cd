//! CPU sets as the kernel writes them: cpulists ("0-3,8,10-11") and hex masks
//! ("ff,00000000"), of any width. Every topology source and every output goes
//! through this one type so that sets compare, print and serialise alike.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The highest CPU number accepted from text: Linux's NR_CPUS tops out at 8192
/// (x86 MAXSMP, ppc64; arm64 4096). Sets are bitmaps, so the bound is what
/// keeps a hostile "0-4000000000", or 65536 cores of 65536-bit sets, from
/// allocating gigabytes.
pub(crate) const MAX_CPU: usize = 8192;

/// Why a cpulist or mask could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    #[error("invalid cpulist {text:?}: {why}")]
    List { text: String, why: String },
    #[error("invalid cpu mask {text:?}: {why}")]
    Mask { text: String, why: String },
}

/// A set of CPU (or NUMA node) numbers, stored as a bitmap.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// The set of a kernel bitmap's words (bit `b` of word `w` is `64w + b`).
    pub(crate) fn from_words(words: Vec<u64>) -> Self {
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// A set holding `0..n`.
    pub fn first_n(n: usize) -> Self {
        (0..n).collect()
    }

    pub fn insert(&mut self, cpu: usize) {
        let (w, b) = (cpu / 64, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    pub fn remove(&mut self, cpu: usize) {
        if let Some(word) = self.words.get_mut(cpu / 64) {
            *word &= !(1 << (cpu % 64));
        }
        self.trim();
    }

    pub fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / 64)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    pub fn last(&self) -> Option<usize> {
        let (i, w) = self
            .words
            .iter()
            .enumerate()
            .rev()
            .find(|(_, w)| **w != 0)?;
        Some(i * 64 + 63 - w.leading_zeros() as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut rest = w;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let b = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(i * 64 + b)
            })
        })
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| self.word(i) | other.word(i))
            .collect::<Vec<_>>();
        CpuSet { words }.trimmed()
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().min(other.words.len());
        let words = (0..n).map(|i| self.word(i) & other.word(i)).collect();
        CpuSet { words }.trimmed()
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let words = (0..self.words.len())
            .map(|i| self.word(i) & !other.word(i))
            .collect();
        CpuSet { words }.trimmed()
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        (0..self.words.len()).all(|i| self.word(i) & !other.word(i) == 0)
    }

    pub fn intersects(&self, other: &CpuSet) -> bool {
        (0..self.words.len().min(other.words.len())).any(|i| self.word(i) & other.word(i) != 0)
    }

    fn word(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    fn trimmed(mut self) -> Self {
        self.trim();
        self
    }

    /// Parse a Linux cpulist: "0-3,8,10-11", "0-31:2" strides, empty = empty set.
    /// Trailing NULs, newlines and spaces are ignored.
    pub fn parse_list(text: &str) -> Result<CpuSet, CpuSetError> {
        let err = |why: &str| CpuSetError::List {
            text: text.to_string(),
            why: why.to_string(),
        };
        let body = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        let mut set = CpuSet::new();
        for part in body.split(',') {
            let part = part.trim();
            if part.is_empty() {
                if body.is_empty() {
                    continue;
                }
                return Err(err("empty element"));
            }
            let (range, stride) = match part.split_once(':') {
                Some((r, s)) => (r, parse_num(s).ok_or_else(|| err("bad stride"))?),
                None => (part, 1),
            };
            if stride == 0 {
                return Err(err("stride 0"));
            }
            let (lo, hi) = match range.split_once('-') {
                Some((a, b)) => (
                    parse_num(a).ok_or_else(|| err("bad number"))?,
                    parse_num(b).ok_or_else(|| err("bad number"))?,
                ),
                None => {
                    let n = parse_num(range).ok_or_else(|| err("bad number"))?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(err("range goes backwards"));
            }
            if hi > MAX_CPU {
                return Err(err("cpu number too large"));
            }
            for cpu in (lo..=hi).step_by(stride) {
                set.insert(cpu);
            }
        }
        Ok(set)
    }

    /// Parse a comma-separated hex mask, most significant 32-bit word first:
    /// Linux "00000000,0000000f" and hwloc "0x00000003,,0x0000000f" (an empty
    /// word is zero). A leading "0x" on any word is accepted.
    pub fn parse_mask(text: &str) -> Result<CpuSet, CpuSetError> {
        let err = |why: &str| CpuSetError::Mask {
            text: text.to_string(),
            why: why.to_string(),
        };
        let body = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        if body.is_empty() {
            return Ok(CpuSet::new());
        }
        let parts: Vec<&str> = body.split(',').collect();
        if parts.len() * 32 > MAX_CPU + 32 {
            return Err(err("mask too wide"));
        }
        let mut set = CpuSet::new();
        for (i, part) in parts.iter().rev().enumerate() {
            let hex = part.trim();
            let hex = hex
                .strip_prefix("0x")
                .or_else(|| hex.strip_prefix("0X"))
                .unwrap_or(hex);
            if hex.is_empty() {
                continue;
            }
            // Some writers put more than 8 digits in the first word (hwloc "0xf...f").
            if hex.len() > 8 && i + 1 != parts.len() {
                return Err(err("word wider than 32 bits"));
            }
            if hex.len() > 16 {
                return Err(err("word wider than 64 bits"));
            }
            let value = u64::from_str_radix(hex, 16).map_err(|_| err("not hexadecimal"))?;
            for b in 0..64 {
                if value & (1 << b) != 0 {
                    let cpu = i * 32 + b;
                    if cpu > MAX_CPU {
                        return Err(err("cpu number too large"));
                    }
                    set.insert(cpu);
                }
            }
        }
        Ok(set)
    }

    /// Parse one hex number of any width, "0x" optional: Slurm's and taskset's
    /// mask form ("0xff00000000000000000000").
    pub fn parse_hex(text: &str) -> Result<CpuSet, CpuSetError> {
        let err = |why: &str| CpuSetError::Mask {
            text: text.to_string(),
            why: why.to_string(),
        };
        let t = text.trim();
        let hex = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if hex.is_empty() || hex.len() > MAX_CPU / 4 {
            return Err(err("not a hex mask"));
        }
        let mut set = CpuSet::new();
        for (i, c) in hex.bytes().rev().enumerate() {
            let v = (c as char)
                .to_digit(16)
                .ok_or_else(|| err("not hexadecimal"))?;
            for b in 0..4 {
                if v & (1 << b) != 0 {
                    set.insert(i * 4 + b);
                }
            }
        }
        Ok(set)
    }

    /// The Linux mask form, 32-bit words most significant first: "ff,00000000".
    pub fn to_mask(&self) -> String {
        let Some(last) = self.last() else {
            return "0".to_string();
        };
        let nwords = last / 32 + 1;
        let mut out = Vec::with_capacity(nwords);
        for i in (0..nwords).rev() {
            let w = (self.word(i / 2) >> (32 * (i % 2))) as u32;
            if i == nwords - 1 {
                out.push(format!("{w:x}"));
            } else {
                out.push(format!("{w:08x}"));
            }
        }
        out.join(",")
    }

    /// One hex number, as Slurm's `mask_cpu:` and taskset take it: "0xf0".
    pub fn to_hex(&self) -> String {
        let Some(last) = self.last() else {
            return "0x0".to_string();
        };
        let mut s = String::from("0x");
        let nwords = last / 64 + 1;
        for i in (0..nwords).rev() {
            if i == nwords - 1 {
                s.push_str(&format!("{:x}", self.word(i)));
            } else {
                s.push_str(&format!("{:016x}", self.word(i)));
            }
        }
        s
    }

    /// Raw 64-bit words, least significant first (for sched_setaffinity).
    pub fn words(&self) -> &[u64] {
        &self.words
    }
}

fn parse_num(s: &str) -> Option<usize> {
    let s = s.trim();
    if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
    }
}

impl fmt::Display for CpuSet {
    /// The cpulist form, ranges merged: "0-3,8".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
        while let Some(lo) = iter.next() {
            let mut hi = lo;
            while iter.peek() == Some(&(hi + 1)) {
                hi = iter.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        CpuSet::parse_list(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_lists() {
        let s = CpuSet::parse_list("0-3,8,10-11\n\0").unwrap();
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!(s.len(), 7);
        assert_eq!(CpuSet::parse_list("").unwrap(), CpuSet::new());
        assert_eq!(CpuSet::parse_list("\n").unwrap().to_string(), "");
        assert_eq!(CpuSet::parse_list("0-7:2").unwrap().to_string(), "0,2,4,6");
        assert!(CpuSet::parse_list("3-1").is_err());
        assert!(CpuSet::parse_list("1,,2").is_err());
        assert!(CpuSet::parse_list("a").is_err());
        assert!(CpuSet::parse_list("0-4000000000").is_err());
    }

    #[test]
    fn parses_linux_and_hwloc_masks() {
        assert_eq!(CpuSet::parse_mask("ff\n").unwrap().to_string(), "0-7");
        assert_eq!(
            CpuSet::parse_mask("00000001,00000000").unwrap().to_string(),
            "32"
        );
        assert_eq!(
            CpuSet::parse_mask("0x00000303,0x03030000,,0x03030303")
                .unwrap()
                .to_string(),
            "0-1,8-9,16-17,24-25,80-81,88-89,96-97,104-105"
        );
        assert!(CpuSet::parse_mask("xyz").is_err());
        assert_eq!(CpuSet::parse_hex("0x1").unwrap().to_string(), "0");
        let wide = CpuSet::parse_hex("0xff000000000000000000000000000000ff000000000000").unwrap();
        assert_eq!(wide.to_string(), "48-55,176-183");
        assert_eq!(CpuSet::parse_hex(&wide.to_hex()).unwrap(), wide);
        assert!(CpuSet::parse_hex("0x").is_err());
        assert!(CpuSet::parse_hex("0xfg").is_err());
        assert!(CpuSet::parse_mask("0,123456789").is_err());
    }

    #[test]
    fn wide_masks() {
        let mut text = vec!["00000000"; 128];
        text[0] = "80000000";
        let s = CpuSet::parse_mask(&text.join(",")).unwrap();
        assert_eq!(s.to_string(), "4095");
        assert_eq!(s.to_mask(), text.join(",").trim_start_matches('0'));
        assert_eq!(CpuSet::parse_list("4095").unwrap().to_hex().len(), 2 + 1024);
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse_list("0-7").unwrap();
        let b = CpuSet::parse_list("4-11").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(a.intersection(&b).is_subset(&a));
        assert!(!a.is_subset(&b));
        assert_eq!(b.last(), Some(11));
        assert_eq!(CpuSet::parse_list("0-3").unwrap().to_hex(), "0xf");
        assert_eq!(CpuSet::parse_list("4-7").unwrap().to_mask(), "f0");
    }

    proptest! {
        #[test]
        fn list_parser_never_panics(s in "\\PC*") {
            let _ = CpuSet::parse_list(&s);
        }

        #[test]
        fn list_parser_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let s = String::from_utf8_lossy(&b);
            let _ = CpuSet::parse_list(&s);
            let _ = CpuSet::parse_mask(&s);
            let _ = CpuSet::parse_hex(&s);
        }

        /// Ranges and masks naming any CPU: an error past MAX_CPU, never a
        /// bitmap of gigabytes.
        #[test]
        fn huge_ids_are_refused(a in any::<u64>(), b in any::<u64>(), width in 0usize..5000) {
            if let Ok(s) = CpuSet::parse_list(&format!("{}-{}", a.min(b), a.max(b))) {
                prop_assert!(s.last().unwrap_or(0) <= MAX_CPU);
            }
            if let Ok(s) = CpuSet::parse_mask(&format!("1{}", "0".repeat(width))) {
                prop_assert!(s.last().unwrap_or(0) <= MAX_CPU);
            }
        }

        #[test]
        fn mask_parser_never_panics(s in "[0-9a-fx,\\s\\x00]{0,80}") {
            let _ = CpuSet::parse_mask(&s);
        }

        #[test]
        fn list_round_trips(cpus in proptest::collection::btree_set(0usize..5000, 0..100)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let back = CpuSet::parse_list(&set.to_string()).unwrap();
            prop_assert_eq!(&back, &set);
            let mask = CpuSet::parse_mask(&set.to_mask()).unwrap();
            prop_assert_eq!(&mask, &set);
            prop_assert_eq!(back.iter().collect::<Vec<_>>(), cpus.into_iter().collect::<Vec<_>>());
        }
    }
}
