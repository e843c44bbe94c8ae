//! Which lines of a block may hold a trigger, found by the literals every match of a trigger must contain.
//!
//! The triggers as one regular expression scan a block at a few hundred MB/s only: the case-insensitive
//! generic step trigger and the short prefixes of others (`] NCCL`, `| `) leave its prefilter little to
//! skip, and every candidate is then run through the automaton. A needed literal is a better filter: a
//! line without any of `step`, `iter`, ` nccl info`, `': `… cannot match, and a multi-literal searcher
//! finds those far faster. The lines it finds are then checked against the triggers themselves (the
//! `RegexSet` that names the parsers), so a literal that also occurs elsewhere costs a check, never a
//! wrong answer. Where a trigger has no such literal (it can match nearly anything), the lane keeps
//! the regular expression scan.

use aho_corasick::packed::{Config, MatchKind, Searcher};
use aho_corasick::Span;
use regex_syntax::hir::{Class, Hir, HirKind};

/// At most this many literals in a set (beyond it, cross products of classes are not worth it).
const MAX_SET: usize = 64;
/// Literals of this many bytes are nearly as selective as longer ones, for ranking: a case-insensitive word
/// then costs 8 variants, not 16 or 64, which keeps the whole set small enough for the fast (Teddy) search.
const ENOUGH: usize = 3;

/// Every string `hir` can match, when they are few (`None` otherwise).
fn exact(hir: &Hir) -> Option<Vec<Vec<u8>>> {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Some(vec![Vec::new()]),
        HirKind::Literal(lit) => Some(vec![lit.0.to_vec()]),
        HirKind::Class(c) => Some(class_bytes(c)?.into_iter().map(|b| vec![b]).collect()),
        HirKind::Capture(c) => exact(&c.sub),
        HirKind::Repetition(r) if r.max == Some(r.min) && r.min <= 64 => {
            let one = exact(&r.sub)?;
            let mut all = vec![Vec::new()];
            for _ in 0..r.min {
                all = product(&all, &one)?;
            }
            Some(all)
        }
        HirKind::Repetition(_) => None,
        HirKind::Concat(subs) => {
            let mut all = vec![Vec::new()];
            for s in subs {
                all = product(&all, &exact(s)?)?;
            }
            Some(all)
        }
        HirKind::Alternation(subs) => {
            let mut all = Vec::new();
            for s in subs {
                all.extend(exact(s)?);
                if all.len() > MAX_SET {
                    return None;
                }
            }
            Some(all)
        }
    }
}

/// The bytes of a small class of ASCII (or byte) characters.
fn class_bytes(c: &Class) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match c {
        Class::Bytes(b) => {
            for r in b.ranges() {
                if usize::from(r.end() - r.start()) + out.len() >= MAX_SET {
                    return None;
                }
                out.extend(r.start()..=r.end());
            }
        }
        Class::Unicode(u) => {
            for r in u.ranges() {
                let (lo, hi) = (u32::from(r.start()), u32::from(r.end()));
                if hi > 0x7f || (hi - lo) as usize + out.len() >= MAX_SET {
                    return None;
                }
                out.extend((lo..=hi).map(|c| c as u8));
            }
        }
    }
    Some(out)
}

fn product(a: &[Vec<u8>], b: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    if a.len() * b.len() > MAX_SET {
        return None;
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            let mut s = x.clone();
            s.extend_from_slice(y);
            out.push(s);
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// Higher is better: the shortest literal's length (up to `ENOUGH`), then fewer literals, then longer ones.
fn score(set: &[Vec<u8>]) -> (usize, isize, usize) {
    let shortest = set.iter().map(Vec::len).min().unwrap_or(0);
    (shortest.min(ENOUGH), -(set.len() as isize), shortest.min(16))
}

fn better(best: Option<Vec<Vec<u8>>>, cand: Option<Vec<Vec<u8>>>) -> Option<Vec<Vec<u8>>> {
    match (best, cand) {
        (None, c) => c.filter(|c| !c.is_empty() && c.iter().all(|s| !s.is_empty())),
        (b, None) => b,
        (Some(b), Some(c)) => {
            if !c.is_empty() && c.iter().all(|s| !s.is_empty()) && score(&c) > score(&b) {
                Some(c)
            } else {
                Some(b)
            }
        }
    }
}

/// A set of non-empty literals at least one of which every match of `hir` contains (`None`: none found).
fn needed(hir: &Hir) -> Option<Vec<Vec<u8>>> {
    match hir.kind() {
        HirKind::Capture(c) => needed(&c.sub),
        HirKind::Repetition(r) if r.min >= 1 => better(needed(&r.sub), exact(hir)),
        HirKind::Alternation(subs) => {
            let mut all = Vec::new();
            for s in subs {
                all.extend(needed(s)?);
            }
            all.sort();
            all.dedup();
            better(None, (all.len() <= MAX_SET).then_some(all))
        }
        HirKind::Concat(subs) => {
            // any child's needed literals, or the strings of a run of exactly known children
            let mut best = None;
            for s in subs {
                best = better(best, needed(s));
            }
            for a in 0..subs.len() {
                let mut run = vec![Vec::new()];
                for s in &subs[a..] {
                    match exact(s).and_then(|e| product(&run, &e)) {
                        Some(r) => run = r,
                        None => break,
                    }
                    best = better(best, Some(run.clone()));
                }
            }
            best
        }
        _ => better(None, exact(hir)),
    }
}

/// The needed literals of each pattern (parsed as the lane compiles them); `None` when some pattern has none
/// (or only single bytes, which are in nearly every line: no better than the regex scan).
fn needed_sets<'a>(patterns: impl Iterator<Item = (usize, &'a String)>) -> Option<Vec<(usize, Vec<Vec<u8>>)>> {
    let mut out = Vec::new();
    for (k, p) in patterns {
        let hir = regex_syntax::ParserBuilder::new().unicode(false).utf8(false).build().parse(p).ok()?;
        let set = needed(&hir)?;
        if set.iter().any(|s| s.len() < 2 || s.contains(&b'\n')) {
            return None;
        }
        out.push((k, set));
    }
    (!out.is_empty()).then_some(out)
}

/// All the literals, without those that contain another (a line holding the longer holds the shorter).
fn absorbed(sets: &[(usize, Vec<Vec<u8>>)]) -> Vec<Vec<u8>> {
    let mut all: Vec<Vec<u8>> = sets.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
    all.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
    all.dedup();
    let mut kept: Vec<Vec<u8>> = Vec::new();
    for s in all {
        if !kept.iter().any(|k| memchr::memmem::find(&s, k).is_some()) {
            kept.push(s);
        }
    }
    kept
}

/// Finds the lines that hold any of the needed literals.
pub struct LineFilter {
    /// the packed (Teddy) searcher itself: the automaton with it as a prefilter walks each candidate bytewise
    ac: Searcher,
    pub literals: Vec<Vec<u8>>,
    /// for each literal, the patterns (by the caller's numbers) that may match in a line holding it
    owners: Vec<Vec<usize>>,
}

impl LineFilter {
    /// For `(number, pattern)` pairs.
    pub fn new<'a>(patterns: impl Iterator<Item = (usize, &'a String)>) -> Option<LineFilter> {
        let sets = needed_sets(patterns)?;
        let lits = absorbed(&sets);
        if lits.len() > MAX_SET {
            return None; // past what the packed (Teddy) search takes: no faster than the regex scan
        }
        let ac = Config::new().match_kind(MatchKind::LeftmostFirst).builder().extend(&lits).build()?;
        // a pattern may match where any literal it needs is, or one that stands in for it (a part of it)
        let owners = lits
            .iter()
            .map(|k| {
                sets.iter()
                    .filter(|(_, set)| set.iter().any(|s| memchr::memmem::find(s, k).is_some()))
                    .map(|(p, _)| *p)
                    .collect()
            })
            .collect();
        Some(LineFilter { ac, literals: lits, owners })
    }

    /// Appends the start offsets of the lines of `block[start..end]` that hold a literal, ascending.
    pub fn lines(&self, block: &[u8], start: usize, end: usize, out: &mut Vec<usize>) {
        let mut at = start;
        while at < end {
            let Some(m) = self.ac.find_in(block, Span::from(at..end)) else { break };
            let line = memchr::memrchr(b'\n', &block[start..m.start()]).map_or(start, |k| start + k + 1);
            out.push(line);
            at = memchr::memchr(b'\n', &block[m.end()..end]).map_or(end, |k| m.end() + k + 1);
        }
    }

    /// Appends (once each) the patterns that may match in `line`: those whose literals it holds. Every
    /// occurrence counts: no kept literal is part of another, so at most one starts at each byte.
    pub fn candidates(&self, line: &[u8], out: &mut Vec<usize>) {
        let mut at = 0;
        while let Some(m) = self.ac.find_in(line, Span::from(at..line.len())) {
            for &p in &self.owners[m.pattern().as_usize()] {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            at = m.start() + 1;
        }
    }
}
