//! The parsers' triggers, compiled once per ingest (`Compiled`, with the patterns the log families read
//! their lines by): which lines of a block hold one, and which parsers' triggers a line holds (found by
//! their literals, `crate::literals`, where they have some; else by a regex scan).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{FastLane, GiveBack, Ids};
use crate::literals::LineFilter;

/// One pattern matching wherever any of `pats` does (ASCII classes, as Hyperscan reads the triggers).
fn any_of<'a>(pats: impl Iterator<Item = &'a String>) -> PyResult<regex::bytes::Regex> {
    let alts: Vec<String> = pats.map(|p| format!("(?:{p})")).collect();
    let src = if alts.is_empty() { "[^\\x00-\\xff]".to_string() } else { alts.join("|") }; // empty: matches nothing
    regex::bytes::RegexBuilder::new(&src).unicode(false).build().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// What a lane compiles from the parsers' triggers, and the patterns of the lines it reads (milliseconds of
/// work): shared by the lanes of all the files of an ingest (`FastLane.fresh`), since a job's logs are often
/// one file per rank.
pub(super) struct Compiled {
    /// All triggers at once, and in one pattern (for all parsers, for those of the alignment pass): where
    /// a trigger needs no literal (`any_filter`, `sync_filter` are `None`), how trigger lines are found.
    pub(super) triggers: Option<regex::bytes::RegexSet>,
    /// Each trigger alone: checked on a line where its literals are (see `literals`).
    pub(super) single: Vec<regex::bytes::Regex>,
    pub(super) any_trigger: Option<regex::bytes::Regex>,
    pub(super) sync_trigger: Option<regex::bytes::Regex>,
    /// The same found through the literals the triggers need (see `literals`), where they have some.
    pub(super) any_filter: Option<LineFilter>,
    pub(super) sync_filter: Option<LineFilter>,
    /// The parser of each trigger, and where the built-in parsers are in the registry.
    pub(super) trigger_parser: Vec<usize>,
    pub(super) generic: Option<usize>,
    pub(super) nccl: Option<usize>,
    pub(super) deepspeed: Option<usize>,
    pub(super) megatron: Option<usize>,
    pub(super) huggingface: Option<usize>,
    pub(super) tqdm_rx: regex::Regex,
    pub(super) ds_progress_rx: regex::Regex,
    pub(super) ds_timers_rx: regex::Regex,
    pub(super) ds_item_rx: regex::Regex,
    /// Parsers whose step lines are clock-alignment moments (`sync_points` with `sync_step`).
    pub(super) sync_parsers: Vec<usize>,
}

impl Compiled {
    /// `triggers[i]` are parser `i`'s trigger patterns (registry order), `names` the parsers' names;
    /// `sync_parsers` those whose lines are clock-alignment moments.
    pub(super) fn new(triggers: &[Vec<String>], names: &[String], sync_parsers: Vec<usize>) -> PyResult<Compiled> {
        let mut pats = Vec::new();
        let mut owner = Vec::new();
        for (i, ts) in triggers.iter().enumerate() {
            for t in ts {
                pats.push(t.clone());
                owner.push(i);
            }
        }
        // ASCII classes and word boundaries, as Hyperscan matches the triggers in the Python engine
        // (and what keeps the pattern in the fast automata: Unicode \b is not).
        // the alignment pass looks only for the triggers of parsers whose lines are moments
        let sync_pats = || pats.iter().enumerate().filter(|(k, _)| sync_parsers.contains(&owner[*k]));
        let any_filter = LineFilter::new(pats.iter().enumerate());
        let sync_filter = LineFilter::new(sync_pats());
        // the regex scan, only where the triggers need no literal (each costs milliseconds to build)
        let any = if any_filter.is_none() { Some(any_of(pats.iter())?) } else { None };
        let sync_any = if sync_filter.is_none() { Some(any_of(sync_pats().map(|(_, t)| t))?) } else { None };
        let set = if any_filter.is_none() || sync_filter.is_none() {
            let set = regex::bytes::RegexSetBuilder::new(&pats).unicode(false).build();
            Some(set.map_err(|e| PyValueError::new_err(e.to_string()))?)
        } else {
            None
        };
        let single = pats
            .iter()
            .map(|p| regex::bytes::RegexBuilder::new(p).unicode(false).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let find = |n: &str| names.iter().position(|x| x == n);
        Ok(Compiled {
            triggers: set,
            single,
            any_trigger: any,
            sync_trigger: sync_any,
            any_filter,
            sync_filter,
            trigger_parser: owner,
            generic: find("generic-step"),
            nccl: find("nccl"),
            deepspeed: find("deepspeed"),
            megatron: find("megatron"),
            huggingface: find("huggingface"),
            // tqdm/std.py format_meter, as ingest/parsers/huggingface.py's _BAR reads it without a description
            tqdm_rx: regex::Regex::new(
                r"^\s*(\d+)%\|[^|]*\| (\d+)/(\d+) \[([\d:]+)<([\d:?]+), +([\d.?]+)(it/s|s/it)([^\]]*)\]",
            )
            .unwrap(),
            // deepspeed/runtime/engine.py `_report_progress` and utils/timer.py, as ingest/parsers/deepspeed.py reads them
            ds_progress_rx: regex::Regex::new(r"step=(\d+), skipped=(\d+), lr=\[?([^\],]*)[^,]*(?:\])?, mom=").unwrap(),
            ds_timers_rx: regex::Regex::new(r"time \(ms\)((?: \| [\w.-]+: [-\d.]+(?: \([^)]*\))?)+)").unwrap(),
            ds_item_rx: regex::Regex::new(r"([\w.-]+): ([-\d.]+)").unwrap(),
            sync_parsers,
        })
    }
}

impl FastLane {
    /// The lines of `block[start:end]` in which a trigger matches (a few in a hundred, in a real log).
    pub(super) fn find_hit_lines(&mut self, block: &[u8], start: usize, end: usize, sync: bool) {
        self.hit_lines.clear();
        self.hit_at = 0;
        if let Some(f) = if sync { &self.c.sync_filter } else { &self.c.any_filter } {
            f.lines(block, start, end, &mut self.hit_lines);
            return;
        }
        let mut last_line = usize::MAX;
        let region = &block[start..end];
        let rx = if sync { &self.c.sync_trigger } else { &self.c.any_trigger };
        let rx = rx.as_ref().expect("a regex scan where the triggers need no literal");
        for m in rx.find_iter(region) {
            // the line holding the match's last byte (a match never ends on a newline it did not cross)
            let at = m.end().saturating_sub(1).max(m.start());
            let line = start + memchr::memrchr(b'\n', &region[..at]).map_or(0, |k| k + 1);
            if line != last_line {
                self.hit_lines.push(line);
                last_line = line;
            }
        }
    }

    /// The parsers whose triggers match in the line (of those whose lines are moments, in the alignment pass),
    /// ascending, as the Python engine's chunk scan sees them.
    pub(super) fn trigger_ids(&self, raw: &[u8], sync: bool, ids: &mut Ids) {
        let push = |k: usize| {
            let p = self.c.trigger_parser[k];
            if (!sync || self.c.sync_parsers.contains(&p)) && !ids.contains(&p) {
                ids.push(p);
            }
        };
        match if sync { &self.c.sync_filter } else { &self.c.any_filter } {
            Some(f) => {
                let mut maybe = Vec::new();
                f.candidates(raw, &mut maybe);
                maybe.into_iter().filter(|&k| self.c.single[k].is_match(raw)).for_each(push);
            }
            None => {
                let set = self.c.triggers.as_ref().expect("a regex set where the triggers need no literal");
                set.matches(raw).iter().for_each(push)
            }
        }
        ids.sort_unstable();
    }

    /// `_parse` tries the triggered parsers in registry order: the lane reads a line only when `parser` comes
    /// first and nothing but the generic step parser follows (it is then never reached).
    pub(super) fn first_then_generic(&self, parser: Option<usize>, ids: &[usize]) -> Result<(), GiveBack> {
        let p = parser.ok_or(GiveBack)?;
        if ids.first() != Some(&p) || !ids.iter().all(|&i| i == p || Some(i) == self.c.generic) {
            return Err(GiveBack);
        }
        Ok(())
    }
}
