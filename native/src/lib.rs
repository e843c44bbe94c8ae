//! jobtrace's compiled parts: the ingest fast lane (this file, with `literals` and `moments`)
//! and the training thread's recorder (`recorder`, used by `otel_instrumentation._native`);
//! `line_writer` writes their event lines' JSON.
//!
//! The Python engine (`ingest/_engine.py`) is the reference: it reads every format and
//! keeps every rule. Most lines of a training log are a handful of kinds, though, and
//! Python spends ~10 µs on each of them however it is written (measured: an ingest whose
//! event writer cost nothing ran at the same rate). This module takes those kinds and
//! writes their events byte for byte as the Python engine would, and gives every other
//! line back to Python, one at a time, in order, with its stream's state:
//!
//! * a Python `logging` line in the strict form of `ingest/_plain.py` with no parser
//!   trigger in it: one log event;
//! * such a line that only the generic step parser triggers on (`step 12 loss … time …
//!   (forward …ms …)`): its log, metric and span events;
//! * DeepSpeed's progress and timer lines (`[date] [INFO] [logging.py:…] [Rank 0] step=…`,
//!   `… time (ms) | fwd: …`), Megatron-LM's iteration lines (` [date] iteration N/ T | …`);
//! * lines with no timestamp that wait for the stream's next one, as the Python engine's
//!   pending lines do: a `print` (no trigger), an NCCL INFO/WARN line, a tqdm refresh, a
//!   Hugging Face Trainer metric dict (`{'loss': 2.3456, 'learning_rate': 4.5e-05, …}`);
//! * in the clock-alignment pass, the moments of generic step, DeepSpeed and Megatron lines,
//!   kept here (`moments::MomentStore`, `SyncMoments`' rules) rather than handed over one by one.
//!
//! Trigger lines are found by the literals every trigger needs (`literals`: derived from the
//! triggers' syntax, searched for all at once), then checked against just the triggers whose
//! literals they hold.
//!
//! A line is given back when anything about it is unusual (another layout, a new stream,
//! a stream whose multi-line block or pending lines Python holds, text outside printable
//! ASCII where Python's and Rust's character classes differ, a number whose JSON text
//! could differ, a message to truncate…), so the output never depends on which engine
//! read a line: `tests/ingest/test_native.py` and every other ingest test compare the two
//! engines' output byte for byte.

use rustc_hash::FxHashMap as HashMap;
use std::rc::Rc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

mod line_writer;
mod literals;
mod moments;
mod recorder;
use line_writer::{json_float, json_str, push_int};
use literals::LineFilter;
use moments::MomentStore;

// ---- the strict Python logging head (ingest/_plain.py) -------------------------------

const LEVELS: [(&[u8], &str); 9] = [
    (b"DEBUG", "DEBUG"),
    (b"INFO", "INFO"),
    (b"WARNING", "WARNING"),
    (b"WARN", "WARNING"),
    (b"ERROR", "ERROR"),
    (b"CRITICAL", "CRITICAL"),
    (b"FATAL", "CRITICAL"),
    (b"TRACE", "DEBUG"),
    (b"NOTICE", "INFO"),
];

struct Head<'a> {
    date: &'a [u8],
    tod: &'a [u8],
    frac: &'a [u8],
    level: &'static str,
    logger: &'a [u8],
    body_at: usize,
}

fn digits(t: &[u8], from: usize, n: usize) -> bool {
    t.len() >= from + n && t[from..from + n].iter().all(u8::is_ascii_digit)
}

fn is_logger_first(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'<'
}

fn is_logger_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'<' | b'>')
}

/// `(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)[.,](\d{1,9}) - (LEVEL) - (logger) - (?=[!-~]|$)`.
fn strict_head(t: &[u8]) -> Option<Head<'_>> {
    if !(digits(t, 0, 4) && t.get(4) == Some(&b'-') && digits(t, 5, 2) && t.get(7) == Some(&b'-')
        && digits(t, 8, 2) && t.get(10) == Some(&b' ') && digits(t, 11, 2) && t.get(13) == Some(&b':')
        && digits(t, 14, 2) && t.get(16) == Some(&b':') && digits(t, 17, 2)
        && matches!(t.get(19), Some(b'.') | Some(b',')))
    {
        return None;
    }
    let mut i = 20;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    let nfrac = i - 20;
    if nfrac == 0 || nfrac > 9 || !t[i..].starts_with(b" - ") {
        return None;
    }
    let frac = &t[20..i];
    i += 3;
    let lstart = i;
    while i < t.len() && t[i].is_ascii_uppercase() {
        i += 1;
    }
    let word = &t[lstart..i];
    let level = LEVELS.iter().find(|(w, _)| *w == word)?.1;
    if !t[i..].starts_with(b" - ") {
        return None;
    }
    i += 3;
    let gstart = i;
    if i >= t.len() || !is_logger_first(t[i]) {
        return None;
    }
    i += 1;
    while i < t.len() && is_logger_char(t[i]) {
        i += 1;
    }
    if i - gstart > 201 || !t[i..].starts_with(b" - ") {
        return None;
    }
    let logger = &t[gstart..i];
    i += 3;
    if i < t.len() && !(0x21..=0x7e).contains(&t[i]) {
        return None;
    }
    Some(Head { date: &t[0..10], tod: &t[11..19], frac, level, logger, body_at: i })
}

fn num(b: &[u8]) -> i64 {
    b.iter().fold(0i64, |a, &c| a * 10 + (c - b'0') as i64)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Epoch day of `YYYY-MM-DD` and second of day of `HH:MM:SS`, as `datetime.date` and
/// `_hms` accept them (a leap second included); `None` for an invalid one.
fn day_and_second(date: &[u8], tod: &[u8]) -> Option<(i64, i64)> {
    let (y, m, d) = (num(&date[0..4]), num(&date[5..7]), num(&date[8..10]));
    if y < 1 || !(1..=12).contains(&m) || d < 1 {
        return None;
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let dim = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][(m - 1) as usize];
    if d > dim {
        return None;
    }
    let (h, mi, s) = (num(&tod[0..2]), num(&tod[3..5]), num(&tod[6..8]));
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some((days_from_civil(y, m, d), h * 3600 + mi * 60 + s))
}

const LAYOUT_NONE: u8 = 0;
const LAYOUT_ISO: u8 = 1;
const LAYOUT_DEEPSPEED: u8 = 2;
const LAYOUT_OTHER: u8 = 3;

/// One pattern matching wherever any of `pats` does (ASCII classes, as Hyperscan reads the triggers).
fn any_of<'a>(pats: impl Iterator<Item = &'a String>) -> PyResult<regex::bytes::Regex> {
    let alts: Vec<String> = pats.map(|p| format!("(?:{p})")).collect();
    let src = if alts.is_empty() { "[^\\x00-\\xff]".to_string() } else { alts.join("|") }; // empty: matches nothing
    regex::bytes::RegexBuilder::new(&src).unicode(false).build().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `end` (at most the block's length) after checking `start <= pos <= end`.
fn check_region(block: &[u8], start: usize, pos: usize, end: usize) -> PyResult<usize> {
    if !(start <= pos && pos <= end && end <= block.len()) {
        return Err(PyValueError::new_err(format!("bad region {start}..{end} (at {pos}) of {} bytes", block.len())));
    }
    Ok(end)
}

fn layout_code(name: Option<&str>) -> u8 {
    match name {
        None => LAYOUT_NONE,
        Some("iso") => LAYOUT_ISO,
        Some("deepspeed") => LAYOUT_DEEPSPEED,
        Some(_) => LAYOUT_OTHER,
    }
}

const UNITS: [&str; 8] = ["ms", "s", "us", "µs", "sec", "secs", "seconds", "msec"];

const FRAC_SCALE: [i64; 10] = [0, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1];

// ---- the stream state the fast lane keeps -------------------------------------------

/// A line without a timestamp, waiting (as in the Python engine) for the stream's next one.
enum Pending {
    Print { msg: String },
    /// A step span of a tqdm bar (`HuggingFaceParser._bar`), `dt` before the line's (estimated) time.
    TqdmSpan { step: i64, dur: i64, id: String, dt: i64 },
    TqdmMetric { n: i64, total: i64 },
    /// A metric event without a time of its own in the layout of `HuggingFaceParser._metrics`:
    /// `{"kind":"metric","metrics":{…}}`, then `"attrs":{"step_estimated":true}` when `estimated`, then `"step"`.
    /// The metrics are finite floats that `json_float` writes (checked where they are made or adopted).
    DictMetric { metrics: Vec<(String, f64)>, step: Option<i64>, estimated: bool },
    Nccl { level: &'static str, msg: String, host: String, pid: i64, tid: i64, dev: i64, src: Option<String> },
}

struct Stream {
    /// The output it writes to; `None` until Python has made it (lines that write are Python's until then).
    out: Option<usize>,
    offset: i64,
    /// `{"job":…,"v":1,` — what the Python engine puts before an encoded event dict.
    open: Vec<u8>,
    /// `"job":…,"v":1` — the identity fields, for the lines written without a dict.
    ident: Vec<u8>,
    last_ts: Option<i64>,
    /// The layout of the last head read here since Python last saw the stream, and its epoch day
    /// (what Python's head parser must note).
    head_note: Option<(&'static str, i64)>,
    /// The layout Python's head parser tries first for this stream (`LAYOUT_*`).
    last_layout: u8,
    /// The stream's rank was guessed: DeepSpeed's `[Rank N]` then routes events (Python's job).
    rank_guessed: bool,
    deepspeed_state: Py<PyDict>,
    megatron_state: Py<PyDict>,
    huggingface_state: Py<PyDict>,
    pending: Vec<Pending>,
    /// Python holds a multi-line block or pending lines of this stream: all its lines go there.
    busy: bool,
    mtime_ns: Option<i64>,
    generic_state: Py<PyDict>,
}

#[derive(Clone)]
enum Role {
    Ignore,
    Metric(String),
    StepDur(f64),
    Phase(String, f64),
    Collective(String, f64),
    /// A duration reported as a metric (`round(ns / 1e6, 6)`): left to Python.
    Other,
}

#[derive(Default)]
struct Counts {
    lines: u64,
    parsed: u64,
    logs: u64,
    metrics: u64,
    spans: u64,
    generic: u64,
    nccl: u64,
    deepspeed: u64,
    megatron: u64,
    huggingface: u64,
    estimated: u64,
    skipped: Vec<(&'static str, u64)>,
}

/// What a lane compiles from the parsers' triggers (milliseconds of work): shared by the lanes of all the files
/// of an ingest (`FastLane.fresh`), since a job's logs are often one file per rank.
struct Compiled {
    /// All triggers at once, and in one pattern (for all parsers, for those of the alignment pass): where
    /// a trigger needs no literal (`any_filter`, `sync_filter` are `None`), how trigger lines are found.
    triggers: Option<regex::bytes::RegexSet>,
    /// Each trigger alone: checked on a line where its literals are (see `literals`).
    single: Vec<regex::bytes::Regex>,
    any_trigger: Option<regex::bytes::Regex>,
    sync_trigger: Option<regex::bytes::Regex>,
    /// The same found through the literals the triggers need (see `literals`), where they have some.
    any_filter: Option<LineFilter>,
    sync_filter: Option<LineFilter>,
    /// The parser of each trigger, and where the built-in parsers are in the registry.
    trigger_parser: Vec<usize>,
    generic: Option<usize>,
    nccl: Option<usize>,
    deepspeed: Option<usize>,
    megatron: Option<usize>,
    huggingface: Option<usize>,
    tqdm_rx: regex::Regex,
    ds_progress_rx: regex::Regex,
    ds_timers_rx: regex::Regex,
    ds_item_rx: regex::Regex,
    /// Parsers whose step lines are clock-alignment moments (`sync_points` with `sync_step`).
    sync_parsers: Vec<usize>,
}

/// The fast lane of one input file: its streams, outputs and counters.
#[pyclass(unsendable)]
struct FastLane {
    /// The compiled triggers and patterns, shared with the lanes of the other files (`fresh`).
    c: Rc<Compiled>,
    srun: bool,
    tz_offset_s: i64,
    cap: usize,
    pending_cap: usize,
    /// Start offsets of the current block's lines that a trigger matched in, ascending, and a cursor.
    hit_lines: Vec<usize>,
    hit_at: usize,
    /// Set by a line that a parser skips (counted as skipped with its reason, not as parsed).
    skipped_line: bool,
    streams: Vec<Stream>,
    by_label: HashMap<Option<u32>, usize>,
    outs: Vec<Vec<u8>>,
    /// Outputs whose sink takes several lines per item (one bytes object per drain).
    chunked: Vec<bool>,
    /// The generic parser's `_role` by key, then by unit (`UNITS` index; 0: none).
    roles: HashMap<String, [Option<Role>; 9]>,
    role_fn: Py<PyAny>,
    /// The number the next span id is made from: set by Python before `run`, read after it.
    #[pyo3(get, set)]
    next_span_id: u64,
    counts: Counts,
    /// The main pass's clock-alignment moments since the last drain, in line order.
    sync: Vec<(Option<u32>, i64, i64)>,
    /// The clock domain (`MomentStore.domain_id`) of each label: in the alignment pass, in the main pass.
    sync_domains: HashMap<Option<u32>, usize>,
    main_domains: HashMap<Option<u32>, usize>,
    /// Alignment pass: the epoch day of the last strict head per label since Python last read a line of it.
    sync_days: HashMap<Option<u32>, (&'static str, i64)>,
    /// Alignment pass: the layout Python's head parser of each label tries first (`LAYOUT_*`).
    sync_layouts: HashMap<Option<u32>, u8>,
}

/// Why a line goes back to Python (nothing of it has been written).
struct GiveBack;

type Ids = Vec<usize>;

/// A line to give back: its start and end in the block, `srun` label, and the parsers its triggers name.
type GivenBack = (usize, usize, Option<u32>, Ids);

#[pymethods]
impl FastLane {
    /// `triggers[i]` are parser `i`'s trigger patterns (registry order); `role` is the
    /// generic parser's `_role(key, unit)`.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        mode: &str,
        tz_offset_s: i64,
        cap: usize,
        pending_cap: usize,
        triggers: Vec<Vec<String>>,
        names: Vec<String>,
        role: Py<PyAny>,
        sync_parsers: Vec<usize>,
    ) -> PyResult<Self> {
        let srun = match mode {
            "srun" => true,
            "none" => false,
            _ => return Err(PyValueError::new_err(format!("prefix mode {mode:?} is not in the fast lane"))),
        };
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
        let compiled = Compiled {
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
        };
        Ok(FastLane::assemble(srun, tz_offset_s, cap, pending_cap, Rc::new(compiled), role))
    }

    /// A lane for another file of the same ingest: this one's settings and compiled triggers, none of its state.
    fn fresh(&self, py: Python<'_>) -> FastLane {
        FastLane::assemble(self.srun, self.tz_offset_s, self.cap, self.pending_cap, self.c.clone(),
                           self.role_fn.clone_ref(py))
    }

    /// Take over (again) the stream of an `srun` label (`None`: lines without one), after Python read a line of
    /// it: its output (`None` while Python has made none), last time, and whether Python holds a multi-line
    /// block or pending lines of it. The lane then holds nothing of the stream (Python has its state).
    #[allow(clippy::too_many_arguments)]
    fn add_stream(
        &mut self,
        label: Option<u32>,
        out: Option<usize>,
        offset: i64,
        ident: &[u8],
        last_ts: Option<i64>,
        busy: bool,
        mtime_ns: Option<i64>,
        generic_state: Py<PyDict>,
        deepspeed_state: Py<PyDict>,
        megatron_state: Py<PyDict>,
        huggingface_state: Py<PyDict>,
        last_layout: Option<String>,
        rank_guessed: bool,
    ) {
        let mut open = Vec::with_capacity(ident.len() + 2);
        open.push(b'{');
        open.extend_from_slice(ident);
        open.push(b',');
        let s = Stream {
            out,
            offset,
            open,
            ident: ident.to_vec(),
            last_ts,
            head_note: None,
            last_layout: layout_code(last_layout.as_deref()),
            rank_guessed,
            deepspeed_state,
            megatron_state,
            huggingface_state,
            pending: Vec::new(),
            busy,
            mtime_ns,
            generic_state,
        };
        match self.by_label.get(&label) {
            Some(&i) => self.streams[i] = s,
            None => {
                self.by_label.insert(label, self.streams.len());
                self.streams.push(s);
            }
        }
    }

    /// Before Python reads a line of the stream: `(last_ts, (layout, day) of the last head read here or None,
    /// pending events as dicts)`, which the
    /// fast lane then no longer holds.
    fn export<'py>(&mut self, py: Python<'py>, label: Option<u32>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(&i) = self.by_label.get(&label) else { return Ok(None) };
        let s = &mut self.streams[i];
        let pend = PyList::empty(py);
        for p in s.pending.drain(..) {
            let d = PyDict::new(py);
            d.set_item("kind", "log")?;
            match p {
                Pending::Print { msg } => {
                    d.set_item("level", "INFO")?;
                    d.set_item("msg", msg)?;
                }
                Pending::TqdmSpan { step, dur, id, dt } => {
                    d.del_item("kind")?;
                    d.set_item("kind", "span")?;
                    d.set_item("cat", "step")?;
                    d.set_item("name", "step")?;
                    d.set_item("step", step)?;
                    d.set_item("dur", dur)?;
                    d.set_item("span_id", id)?;
                    let a = PyDict::new(py);
                    a.set_item("source", "tqdm")?;
                    d.set_item("attrs", a)?;
                    d.set_item("dt", dt)?;
                }
                Pending::TqdmMetric { n, total } => {
                    d.del_item("kind")?;
                    d.set_item("kind", "metric")?;
                    d.set_item("step", n)?;
                    let m = PyDict::new(py);
                    m.set_item("progress", n as f64)?;
                    m.set_item("progress_total", total as f64)?;
                    d.set_item("metrics", m)?;
                }
                Pending::DictMetric { metrics, step, estimated } => {
                    d.set_item("kind", "metric")?; // "kind" keeps its first place
                    let m = PyDict::new(py);
                    for (k, v) in metrics {
                        m.set_item(k, v)?;
                    }
                    d.set_item("metrics", m)?;
                    if estimated {
                        let a = PyDict::new(py);
                        a.set_item("step_estimated", true)?;
                        d.set_item("attrs", a)?;
                    }
                    if let Some(step) = step {
                        d.set_item("step", step)?;
                    }
                }
                Pending::Nccl { level, msg, host, pid, tid, dev, src } => {
                    d.set_item("level", level)?;
                    d.set_item("logger", "nccl")?;
                    d.set_item("msg", msg)?;
                    let a = PyDict::new(py);
                    a.set_item("nccl_host", host)?;
                    a.set_item("nccl_pid", pid)?;
                    a.set_item("tid", tid)?;
                    a.set_item("cuda_dev", dev)?;
                    if let Some(src) = src {
                        a.set_item("src", src)?;
                    }
                    d.set_item("attrs", a)?;
                }
            }
            pend.append((d, 0))?;
        }
        let day = s.head_note.take();
        Ok(Some(PyTuple::new(py, [s.last_ts.into_pyobject(py)?.into_any(), day.into_pyobject(py)?.into_any(), pend.into_any()])?))
    }

    /// Read the lines of `block[start:end]` from byte `pos` until one that Python must read, or the end.
    ///
    /// The region is lines joined by `\n` (an empty one is one empty line); `pos == start`
    /// begins it. Returns `None` at the end, else `(start, end, label, ids)` of the line to
    /// give back: its `srun` label (`None` without one) and the indices of the parsers its
    /// triggers name.
    #[pyo3(signature = (block, start, pos, end))]
    fn run(
        &mut self,
        py: Python<'_>,
        block: &[u8],
        start: usize,
        pos: usize,
        end: usize,
    ) -> PyResult<Option<GivenBack>> {
        let n = check_region(block, start, pos, end)?;
        if pos == start {
            self.find_hit_lines(block, start, n, false);
        }
        let mut at = pos;
        loop {
            let eol = memchr::memchr(b'\n', &block[at..n]).map_or(n, |k| at + k);
            let raw = &block[at..eol];
            let mut ids = Vec::new();
            while self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] < at {
                self.hit_at += 1;
            }
            let hit = self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] == at;
            match self.line(py, raw, hit, &mut ids) {
                Ok(true) => {}
                Ok(false) | Err(GiveBack) => return Ok(Some((at, eol, self.label_of(raw), ids))),
            }
            self.counts.lines += 1;
            if !std::mem::take(&mut self.skipped_line) {
                self.counts.parsed += 1; // a line a parser skips is counted with its reason instead
            }
            if eol >= n {
                return Ok(None);
            }
            at = eol + 1;
        }
    }

    /// The clock-alignment pass (`Ingestor._sync_block`): adds the moments of `block[start:end]` from byte `pos`
    /// to `store`, until a line that Python must read.
    ///
    /// Returns `None` at the end, or the line to give back as `(start, end, label, sync parser ids, head)`,
    /// where `head` is `(layout, epoch day)` of the last head of that label read here since the previous such
    /// line (to note in Python's head parser); ids and head are `None` when the lane needs the clock domain of
    /// the label first (`set_domain`), then reads on from the same line.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (block, start, pos, end, store))]
    fn sync_run(
        &mut self,
        block: &[u8],
        start: usize,
        pos: usize,
        end: usize,
        store: &Bound<'_, MomentStore>,
    ) -> PyResult<Option<(usize, usize, Option<u32>, Option<Ids>, Option<(&'static str, i64)>)>> {
        let n = check_region(block, start, pos, end)?;
        if pos == start {
            self.find_hit_lines(block, start, n, true);
        }
        let mut store = store.borrow_mut();
        // only the trigger lines can hold moments: the lane goes from one to the next, past all the others
        while self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] < pos {
            self.hit_at += 1;
        }
        let mut ids: Ids = Vec::new();
        while let Some(&at) = self.hit_lines.get(self.hit_at) {
            self.hit_at += 1;
            let eol = memchr::memchr(b'\n', &block[at..n]).map_or(n, |k| at + k);
            let raw = &block[at..eol];
            ids.clear();
            self.trigger_ids(raw, true, &mut ids);
            if ids.is_empty() {
                continue;
            }
            let label = self.label_of(raw);
            let Some(&domain) = self.sync_domains.get(&label) else {
                self.hit_at -= 1; // read again from this line once Python has named its domain
                return Ok(Some((at, eol, label, None, None)));
            };
            match self.sync_line(raw, &ids) {
                Ok(Some((_, step, ts))) => store.add_id(domain, step, ts),
                Ok(None) => {}
                Err(GiveBack) => {
                    let day = self.sync_days.remove(&label);
                    return Ok(Some((at, eol, label, Some(ids), day)));
                }
            }
        }
        Ok(None)
    }

    /// At the end of the file: write the lines still waiting for a time at the stream's last time (or the
    /// file's), as `_release_pending(final=True)` does; streams without an output keep theirs (Python's).
    fn release_all(&mut self) {
        for si in 0..self.streams.len() {
            let s = &self.streams[si];
            if s.pending.is_empty() || s.out.is_none() {
                continue;
            }
            if let Some(lo) = s.last_ts.or(s.mtime_ns) {
                self.write_released(si, lo, lo);
                self.streams[si].last_ts = Some(lo);
            }
        }
    }

    /// Take over the lines a stream's Python side holds waiting for a time (`[(event dict, 0)]`, as
    /// `_emit` keeps them) when each is of a kind the lane writes exactly as `_write` would; then the
    /// stream is no longer busy. False (nothing taken) otherwise. This is what lets the lane read a
    /// log whose lines carry no time at all: its first line, read by Python, leaves one waiting.
    fn adopt_pending(&mut self, label: Option<u32>, pending: &Bound<'_, PyList>) -> PyResult<bool> {
        let Some(&si) = self.by_label.get(&label) else { return Ok(false) };
        if !self.streams[si].pending.is_empty() {
            return Ok(false);
        }
        let mut taken = Vec::with_capacity(pending.len());
        for item in pending.iter() {
            let Ok((ev, _)) = item.extract::<(Bound<'_, PyDict>, i64)>() else { return Ok(false) };
            match pending_of(&ev) {
                Some(p) => taken.push(p),
                None => return Ok(false),
            }
        }
        let s = &mut self.streams[si];
        s.pending = taken;
        s.busy = false;
        Ok(true)
    }

    /// The sink of output `out` takes items of several lines (`shippers.Sink.takes_chunks`).
    fn chunked_output(&mut self, out: usize) {
        if self.chunked.len() <= out {
            self.chunked.resize(out + 1, false);
        }
        self.chunked[out] = true;
    }

    /// The parsers (numbers) whose triggers match in `raw` as the lane finds them (checked against Python's
    /// matcher by the tests).
    #[pyo3(signature = (raw, sync=false))]
    fn line_triggers(&self, raw: &[u8], sync: bool) -> Ids {
        let mut ids = Vec::new();
        self.trigger_ids(raw, sync, &mut ids);
        ids
    }

    /// The literals the lane finds trigger lines by (`None`: it scans with the triggers themselves), for the
    /// main pass or the alignment pass.
    fn filter_literals(&self, sync: bool) -> Option<Vec<Vec<u8>>> {
        let f = if sync { &self.c.sync_filter } else { &self.c.any_filter };
        f.as_ref().map(|f| f.literals.clone())
    }

    /// The clock domain (`store.domain_id`) of a label's moments, in the alignment pass (`sync`) or the main pass.
    fn set_domain(&mut self, label: Option<u32>, domain: usize, sync: bool) {
        let map = if sync { &mut self.sync_domains } else { &mut self.main_domains };
        map.insert(label, domain);
    }

    /// Alignment pass: after Python read a line of the label, the layout its head parser now tries first.
    fn sync_layout(&mut self, label: Option<u32>, layout: Option<&str>) {
        self.sync_layouts.insert(label, layout_code(layout));
    }

    /// What was written since the last call: `(outputs, counts)`; the step ends that are clock-alignment
    /// moments go to `store` (none: they are not wanted).
    ///
    /// Outputs are `(out, [event line bytes])` by output index (one `bytes` of whole lines for a chunked
    /// output); counts a dict of the summary's numbers.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (store=None))]
    fn drain<'py>(
        &mut self,
        py: Python<'py>,
        store: Option<&Bound<'py, MomentStore>>,
    ) -> PyResult<(Vec<(usize, Bound<'py, PyAny>)>, Bound<'py, PyDict>)> {
        let mut outs = Vec::new();
        for (i, buf) in self.outs.iter_mut().enumerate() {
            if !buf.is_empty() && self.chunked.get(i).copied().unwrap_or(false) {
                outs.push((i, PyBytes::new(py, buf).into_any()));
                buf.clear();
            } else if !buf.is_empty() {
                // one bytes object per event line, as sinks take them (the buffer keeps its memory)
                let list = PyList::empty(py);
                let mut start = 0;
                for end in memchr::memchr_iter(b'\n', buf) {
                    list.append(PyBytes::new(py, &buf[start..=end]))?;
                    start = end + 1;
                }
                outs.push((i, list.into_any()));
                buf.clear();
            }
        }
        let c = std::mem::take(&mut self.counts);
        let d = PyDict::new(py);
        d.set_item("lines", c.lines)?;
        d.set_item("parsed", c.parsed)?;
        d.set_item("log", c.logs)?;
        d.set_item("metric", c.metrics)?;
        d.set_item("span", c.spans)?;
        d.set_item("generic-step", c.generic)?;
        d.set_item("nccl", c.nccl)?;
        d.set_item("deepspeed", c.deepspeed)?;
        d.set_item("megatron", c.megatron)?;
        d.set_item("huggingface", c.huggingface)?;
        let sk = PyDict::new(py);
        for (reason, n) in &c.skipped {
            sk.set_item(*reason, *n)?;
        }
        d.set_item("skipped", sk)?;
        d.set_item("estimated", c.estimated)?;
        match store {
            Some(store) => {
                let mut store = store.borrow_mut();
                for (label, step, ts) in self.sync.drain(..) {
                    let Some(&domain) = self.main_domains.get(&label) else {
                        return Err(PyValueError::new_err(format!("no clock domain for label {label:?}")));
                    };
                    store.add_id(domain, step, ts);
                }
            }
            None => self.sync.clear(),
        }
        Ok((outs, d))
    }
}

impl FastLane {
    fn assemble(srun: bool, tz_offset_s: i64, cap: usize, pending_cap: usize, c: Rc<Compiled>,
                role: Py<PyAny>) -> FastLane {
        FastLane {
            c,
            srun,
            tz_offset_s,
            cap,
            pending_cap,
            hit_lines: Vec::new(),
            hit_at: 0,
            skipped_line: false,
            streams: Vec::new(),
            by_label: HashMap::default(),
            outs: Vec::new(),
            chunked: Vec::new(),
            roles: HashMap::default(),
            role_fn: role,
            next_span_id: 1,
            counts: Counts::default(),
            sync: Vec::new(),
            sync_domains: HashMap::default(),
            main_domains: HashMap::default(),
            sync_days: HashMap::default(),
            sync_layouts: HashMap::default(),
        }
    }

    /// The lines of `block[start:end]` in which a trigger matches (a few in a hundred, in a real log).
    fn find_hit_lines(&mut self, block: &[u8], start: usize, end: usize, sync: bool) {
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
    fn trigger_ids(&self, raw: &[u8], sync: bool, ids: &mut Ids) {
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

    /// The `srun` label of a clean UTF-8 line without NUL bytes (`None` without one) and the text after it.
    fn split_label<'a>(&self, raw: &'a [u8]) -> Result<(Option<u32>, &'a [u8]), GiveBack> {
        if raw.contains(&0) || std::str::from_utf8(raw).is_err() {
            return Err(GiveBack);
        }
        Ok(match srun_label(raw).filter(|_| self.srun) {
            Some((r, at)) => (Some(r), &raw[at..]),
            None => (None, raw),
        })
    }

    fn label_of(&self, raw: &[u8]) -> Option<u32> {
        // the srun label a line starts with, whatever else it holds
        if !self.srun {
            return None;
        }
        srun_label(raw).map(|(r, _)| r)
    }

    fn out_buf(&mut self, out: usize) -> &mut Vec<u8> {
        if self.outs.len() <= out {
            self.outs.resize_with(out + 1, Vec::new);
        }
        &mut self.outs[out]
    }

    /// Read one line; `Ok(true)`: written (or pending), `Ok(false)`/`Err`: Python's.
    fn line(&mut self, py: Python<'_>, raw: &[u8], hit: bool, ids: &mut Ids) -> Result<bool, GiveBack> {
        if hit {
            self.trigger_ids(raw, false, ids);
        }
        let (label, text) = self.split_label(raw)?;
        let Some(&si) = self.by_label.get(&label) else { return Err(GiveBack) };
        if self.streams[si].busy || text.is_empty() {
            return Err(GiveBack);
        }
        if text.starts_with(b" [") {
            return self.megatron_line(py, si, label, text, ids); // Megatron's " [date time] iteration …"
        }
        if text[0] == b' ' && ids.len() == 1 && Some(ids[0]) == self.c.huggingface {
            return self.tqdm_line(py, si, text); // no head layout starts with a blank not followed by "["
        }
        // A blank text, or one that starts with white space: Python's.
        if !(0x21..=0x7e).contains(&text[0]) {
            return Err(GiveBack);
        }
        if text[0] == b'[' {
            return self.deepspeed_line(py, si, label, text, ids); // else a torchrun prefix or another bracketed head
        }
        if let Some(h) = strict_head(text) {
            if self.streams[si].out.is_none() {
                return Err(GiveBack);
            }
            let ts = self.stamp(&h).ok_or(GiveBack)?;
            let body = &text[h.body_at..];
            return match ids.as_slice() {
                [] => self.plain(si, ts, &h, body),
                [g] if Some(*g) == self.c.generic => self.step_line(py, si, label, ts, &h, body),
                _ => Err(GiveBack),
            };
        }
        if may_have_head(text[0]) {
            return Err(GiveBack);
        }
        match ids.as_slice() {
            [] => self.print_line(si, text),
            [p] if Some(*p) == self.c.nccl => self.nccl_line(si, text),
            [p, ..] if Some(*p) == self.c.huggingface && text[0] == b'{' => self.hf_dict_line(py, si, text, ids),
            _ => Err(GiveBack),
        }
    }

    fn stamp(&self, h: &Head<'_>) -> Option<(i64, i64)> {
        let (day, sod) = day_and_second(h.date, h.tod)?;
        let base = (day * 86400 + sod - self.tz_offset_s) * 1_000_000_000;
        Some((base + num(h.frac) * FRAC_SCALE[h.frac.len()], day))
    }

    /// A DeepSpeed head (`[date time,frac] [LEVEL] [file:line:func]`), its time (UTC ns) and epoch day.
    fn ds_stamp<'a>(&self, text: &'a [u8]) -> Option<(DsHead<'a>, i64, i64)> {
        let h = ds_head(text)?;
        let (day, sod) = day_and_second(h.date, h.tod)?;
        let frac = if h.frac.is_empty() { 0 } else { num(h.frac) * FRAC_SCALE[h.frac.len()] };
        Some((h, (day * 86400 + sod - self.tz_offset_s) * 1_000_000_000 + frac, day))
    }

    /// Lines without a timestamp wait for the stream's next one (`upto`); then they get times spread between.
    fn release(&mut self, si: usize, upto: i64) {
        let s = &self.streams[si];
        if s.pending.is_empty() {
            return;
        }
        let lo = s.last_ts.unwrap_or(upto);
        self.write_released(si, lo, if upto >= lo { upto } else { lo });
    }

    /// Spread the pending lines' times over `(lo, hi)` (all at `lo` when the range is empty) and write them.
    fn write_released(&mut self, si: usize, lo: i64, hi: i64) {
        let s = &mut self.streams[si];
        let n = s.pending.len() as i64;
        let pend = std::mem::take(&mut s.pending);
        let (open, offset, out) = (std::mem::take(&mut s.open), s.offset, s.out.expect("checked by the caller"));
        self.counts.estimated += n as u64;
        for p in &pend {
            match p {
                Pending::TqdmSpan { .. } => self.counts.spans += 1,
                Pending::TqdmMetric { .. } | Pending::DictMetric { .. } => self.counts.metrics += 1,
                _ => self.counts.logs += 1,
            }
        }
        let buf = self.out_buf(out);
        for (i, p) in pend.into_iter().enumerate() {
            let t = if hi > lo { lo + (hi - lo) * (i as i64 + 1) / (n + 1) } else { lo };
            write_pending(buf, &open, &p, t + offset);
        }
        self.streams[si].open = open;
    }

    fn push_pending(&mut self, si: usize, p: Pending) -> Result<bool, GiveBack> {
        let s = &mut self.streams[si];
        if s.pending.len() + 1 >= self.pending_cap {
            // Too many lines without a time: as the Python engine, write them all at the stream's last
            // time (or the file's), which then stays the stream's last time.
            let Some(lo) = s.last_ts.or(s.mtime_ns).filter(|_| s.out.is_some()) else { return Err(GiveBack) };
            s.pending.push(p);
            self.write_released(si, lo, lo);
            self.streams[si].last_ts = Some(lo);
            return Ok(true);
        }
        s.pending.push(p);
        Ok(true)
    }

    fn print_line(&mut self, si: usize, text: &[u8]) -> Result<bool, GiveBack> {
        if text.len() > self.cap {
            return Err(GiveBack);
        }
        let msg = String::from_utf8(text.to_vec()).map_err(|_| GiveBack)?;
        self.push_pending(si, Pending::Print { msg })
    }

    fn nccl_line(&mut self, si: usize, text: &[u8]) -> Result<bool, GiveBack> {
        if !text.is_ascii() {
            return Err(GiveBack); // `\w` and friends differ between Python and Rust outside ASCII
        }
        let t = std::str::from_utf8(text).map_err(|_| GiveBack)?;
        let c = nccl_at_start(t).ok_or(GiveBack)?;
        if c.msg.len() > self.cap {
            return Err(GiveBack);
        }
        let level = match c.lvl {
            "WARN" | "ABORT" => "WARNING",
            "TRACE" | "CALL" => "DEBUG",
            _ => "INFO",
        };
        let p = Pending::Nccl {
            level,
            msg: c.msg.to_string(),
            host: c.host.to_string(),
            pid: c.pid,
            tid: c.tid,
            dev: c.dev,
            src: c.src.map(|(f, l)| format!("{f}:{l}")),
        };
        let taken = self.push_pending(si, p)?;
        self.counts.nccl += 1;
        Ok(taken)
    }

    /// A tqdm refresh without a description (`  12%|█▏   | 120/1000 [00:30<03:40,  4.00it/s]`), as
    /// `HuggingFaceParser._bar` reads it: steps, progress, or a counted skip; all wait for a time.
    fn tqdm_line(&mut self, py: Python<'_>, si: usize, text: &[u8]) -> Result<bool, GiveBack> {
        if text.len() > self.cap || self.streams[si].out.is_none() {
            return Err(GiveBack);
        }
        let t = std::str::from_utf8(text).map_err(|_| GiveBack)?;
        let bar_at = t.find('|').ok_or(GiveBack)?;
        if t[..bar_at].contains(": ") || t.contains("{'") {
            return Err(GiveBack); // a description (or a metrics dict): Python's
        }
        let c = self.c.tqdm_rx.captures(t).ok_or(GiveBack)?;
        if !(2..=7).all(|k| c[k].is_ascii()) {
            return Err(GiveBack); // `\d` admits digits that Python's int() and float() read and Rust's do not
        }
        let int = |k: usize| c[k].parse::<i64>().map_err(|_| GiveBack);
        let (n, total) = (int(2)?, int(3)?);
        let el = seconds(&c[4])?;
        let st = self.streams[si].huggingface_state.clone_ref(py);
        let st = st.bind(py);
        let bar: Option<(String, i64)> = match st.get_item("bar").map_err(|_| GiveBack)? {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => Some(v.extract().map_err(|_| GiveBack)?),
        };
        let key = (String::new(), total);
        let state_n = get_int(st, "n")?;
        // Lines waiting for a time: Python releases them all at once past the cap; so does the lane.
        let mut events: Vec<Pending> = Vec::new();
        let skip: Option<&'static str>;
        if bar.is_none() || (bar.as_ref() == Some(&key) && n < state_n.unwrap_or(0)) {
            skip = if n == 0 { Some("progress bar start") } else { None };
            self.check_room(si, if skip.is_some() { 0 } else { 1 })?;
            st.set_item("bar", (String::new(), total)).map_err(|_| GiveBack)?;
            st.set_item("n", n).map_err(|_| GiveBack)?;
            st.set_item("el", el).map_err(|_| GiveBack)?;
        } else if bar.as_ref() != Some(&key) {
            skip = Some("progress of another bar (evaluation)");
        } else {
            let prev = state_n.unwrap_or(0);
            if n <= prev {
                skip = Some("progress bar refresh without a new step");
            } else {
                skip = None;
                let rate_s = &c[6];
                let rate = if rate_s == "?" { None } else { rate_s.parse::<f64>().ok() };
                let mut per_step: Option<f64> = None;
                match rate {
                    Some(r) if r != 0.0 && r > 0.0 => per_step = Some(if &c[7] == "s/it" { r } else { 1.0 / r }),
                    _ => {
                        let prev_el = get_float(st, "el")?;
                        if let (Some(e), Some(p)) = (el, prev_el) {
                            if e > p {
                                per_step = Some((e - p) / (n - prev) as f64);
                            }
                        }
                    }
                }
                let mut k = 1;
                let mut dur = 0i64;
                let mut first = n + 1;
                if let Some(ps) = per_step.filter(|v| *v > 0.0) {
                    if !(ps * 1e9).is_finite() || ps * 1e9 >= 9e18 {
                        return Err(GiveBack);
                    }
                    dur = (ps * 1e9) as i64;
                    first = (prev + 1).max(n - 10_000 + 1);
                    k += (n - first + 1) as usize;
                }
                self.check_room(si, k + 1)?;
                st.set_item("n", n).map_err(|_| GiveBack)?;
                st.set_item("el", el).map_err(|_| GiveBack)?;
                for step in first..=n {
                    let id = self.new_span_id();
                    events.push(Pending::TqdmSpan { step, dur, id, dt: -(n - step) * dur });
                }
                events.push(Pending::TqdmMetric { n, total });
            }
        }
        self.counts.huggingface += 1;
        if let Some(reason) = skip {
            match self.counts.skipped.iter_mut().find(|(r, _)| *r == reason) {
                Some(e) => e.1 += 1,
                None => self.counts.skipped.push((reason, 1)),
            }
            self.skipped_line = true;
            return Ok(true);
        }
        let msg = t.to_string();
        let mut all = Vec::with_capacity(events.len() + 1);
        all.push(Pending::Print { msg }); // the line itself, as `_parse` adds it
        all.extend(events);
        self.push_pending_all(si, all);
        Ok(true)
    }

    /// A Hugging Face Trainer metric dict (`ProgressCallback.on_log`: `str(logs)`, or since transformers 4.46 with
    /// the floats as `f"{v:.4g}"` strings), as `HuggingFaceParser._metrics` reads it: the line and a metric
    /// event, both waiting for a time like a `print`. Only the exact shape of `hf_dict` is read here.
    fn hf_dict_line(&mut self, py: Python<'_>, si: usize, text: &[u8], ids: &[usize]) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.huggingface, ids)?; // a dict of metrics always stops the parser loop
        // `_metrics` leaves a blob of 64 KiB or more to `_PAIR`; a message past the cap is cut: Python's
        if text.len() > self.cap || text.len() >= 65536 {
            return Err(GiveBack);
        }
        let metrics = hf_dict(text).ok_or(GiveBack)?;
        let msg = String::from_utf8(text.to_vec()).map_err(|_| GiveBack)?;
        self.check_room(si, 2)?;
        let (step, estimated) = {
            let st = self.streams[si].huggingface_state.bind(py);
            let n = get_int(st, "n")?;
            let mut dicts = get_int(st, "dicts")?;
            if metrics.iter().any(|(k, _)| k == "loss") {
                let d = dicts.unwrap_or(0).checked_add(1).ok_or(GiveBack)?;
                st.set_item("dicts", d).map_err(|_| GiveBack)?; // the last that can give the line back
                dicts = Some(d);
            }
            // the bar's count, else the count of loss dicts so far (marked estimated), else none
            match (n, dicts) {
                (Some(n), _) => (Some(n), false),
                (None, Some(d)) if d != 0 => (Some(d), true),
                _ => (None, false),
            }
        };
        self.counts.huggingface += 1;
        // the line itself first, as `_parse` adds it
        self.push_pending_all(si, vec![Pending::Print { msg }, Pending::DictMetric { metrics, step, estimated }]);
        Ok(true)
    }

    /// Whether `k` more pending events fit before the cap, or the stream can release them as Python would.
    fn check_room(&self, si: usize, k: usize) -> Result<(), GiveBack> {
        let s = &self.streams[si];
        if s.pending.len() + k >= self.pending_cap && (s.last_ts.or(s.mtime_ns).is_none() || s.out.is_none()) {
            return Err(GiveBack);
        }
        Ok(())
    }

    /// Append a line's pending events, then (as `_emit`) release them all at the cap.
    fn push_pending_all(&mut self, si: usize, events: Vec<Pending>) {
        let s = &mut self.streams[si];
        s.pending.extend(events);
        if s.pending.len() >= self.pending_cap {
            let lo = s.last_ts.or(s.mtime_ns).expect("checked by check_room");
            self.write_released(si, lo, lo);
            self.streams[si].last_ts = Some(lo);
        }
    }

    /// Before a dated line's events: the stream's waiting lines first (they get times up to `ts`), then its
    /// time and head state. Returns its output, clock offset and `{identity,` prefix, which the caller puts
    /// back (`self.streams[si].open = open`) once written.
    fn begin_write(&mut self, si: usize, ts: i64, note: (&'static str, i64), layout: u8) -> (usize, i64, Vec<u8>) {
        self.release(si, ts);
        let s = &mut self.streams[si];
        s.last_ts = Some(s.last_ts.map_or(ts, |l| l.max(ts)));
        s.head_note = Some(note);
        s.last_layout = layout;
        (s.out.expect("checked by the caller"), s.offset, std::mem::take(&mut s.open))
    }

    /// `_parse` tries the triggered parsers in registry order: the lane reads a line only when `parser` comes
    /// first and nothing but the generic step parser follows (it is then never reached).
    fn first_then_generic(&self, parser: Option<usize>, ids: &[usize]) -> Result<(), GiveBack> {
        let p = parser.ok_or(GiveBack)?;
        if ids.first() != Some(&p) || !ids.iter().all(|&i| i == p || Some(i) == self.c.generic) {
            return Err(GiveBack);
        }
        Ok(())
    }

    /// A Megatron-LM iteration line (`training_log`: ` [date time] iteration N/ T | key: value | …`), as the
    /// "bracket-iso" head layout and `MegatronParser._iteration` read it.
    fn megatron_line(
        &mut self,
        py: Python<'_>,
        si: usize,
        label: Option<u32>,
        text: &[u8],
        ids: &[usize],
    ) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.megatron, ids)?;
        if self.streams[si].out.is_none() {
            return Err(GiveBack);
        }
        let (ts, day, body_at) = megatron_head(text, self.tz_offset_s).ok_or(GiveBack)?;
        let body = &text[body_at..];
        if body.len() > self.cap || !printable(body) {
            return Err(GiveBack);
        }
        let body_s = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        let (it, total, at) = megatron_iter(body_s).ok_or(GiveBack)?;
        let mut m: Vec<(String, String)> = vec![("train_iters".into(), json_float(total as f64).ok_or(GiveBack)?)];
        let mut values: Vec<(String, f64)> = Vec::new(); // the numbers behind m, by name
        let mut first_loss: Option<f64> = None;
        for field in body_s[at..].split('|') {
            let Some((key, raw)) = field.split_once(':') else { continue };
            let key = key.trim();
            if key.is_empty() {
                continue;
            }
            // `number(raw)`: float(raw.strip().rstrip(",")); only plain decimal numbers here
            let r = raw.trim().trim_end_matches(',').trim();
            if r.is_empty() || !r.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
                return Err(GiveBack);
            }
            let Ok(v) = r.parse::<f64>() else { continue };
            let name = match megatron_key(key) {
                Some(n) => n.to_string(),
                None => {
                    let n = metric_name(key);
                    if key.contains("loss") && !key.contains("scale") && first_loss.is_none() {
                        first_loss = Some(v);
                    }
                    n
                }
            };
            let j = metric_json(v)?;
            match m.iter_mut().find(|(k, _)| *k == name) {
                Some(e) => e.1 = j,
                None => m.push((name.clone(), j)),
            }
            match values.iter_mut().find(|(k, _)| *k == name) {
                Some(e) => e.1 = v,
                None => values.push((name, v)),
            }
        }
        let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|e| e.1);
        if let Some(l) = first_loss {
            if !m.iter().any(|(k, _)| k == "loss") {
                m.push(("loss".into(), metric_json(l)?));
            }
        } else if get("nan_iters").is_some_and(|v| v != 0.0) {
            match m.iter_mut().find(|(k, _)| k == "loss") {
                Some(e) => e.1 = "\"NaN\"".into(),
                None => m.push(("loss".into(), "\"NaN\"".into())),
            }
        }
        let iter_ms = get("iter_ms");
        if iter_ms.is_some_and(|v| !v.is_finite()) || get("global_batch_size").is_some_and(|v| !v.is_finite()) {
            return Err(GiveBack); // metric_value() made them strings: Python's
        }
        if let (Some(ms), Some(batch)) = (iter_ms, get("global_batch_size")) {
            if ms > 0.0 {
                let x = batch / (ms / 1000.0);
                if !x.is_finite() {
                    return Err(GiveBack);
                }
                // round(x, 3): Rust's fixed precision rounds the exact value half to even, as Python's round does
                let r: f64 = format!("{:.3}", x).parse().map_err(|_| GiveBack)?;
                let j = json_float(r).ok_or(GiveBack)?;
                match m.iter_mut().find(|(k, _)| k == "samples_per_s") {
                    Some(e) => e.1 = j,
                    None => m.push(("samples_per_s".into(), j)),
                }
            }
        }
        let dur = match iter_ms {
            Some(ms) if ms > 0.0 => {
                if !(ms * 1e6).is_finite() || ms * 1e6 >= 9e18 {
                    return Err(GiveBack);
                }
                Some((ms * 1e6) as i64)
            }
            _ => None,
        };
        // From here on the state changes and the events are written.
        let id = dur.map(|_| self.new_span_id());
        {
            let st = self.streams[si].megatron_state.bind(py);
            st.set_item("iteration", it).map_err(|_| GiveBack)?;
            st.set_item("iter_ms", iter_ms).map_err(|_| GiveBack)?;
            if let Some(id) = &id {
                st.set_item("step_span", id).map_err(|_| GiveBack)?;
            }
        }
        let (out, offset, open) = self.begin_write(si, ts, ("bracket-iso", day), LAYOUT_OTHER);
        let buf = self.out_buf(out);
        let t = ts + offset;
        buf.extend_from_slice(&open);
        buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"INFO\",\"msg\":");
        json_str(buf, body);
        buf.extend_from_slice(b",\"ts\":");
        push_int(buf, t);
        buf.extend_from_slice(b"}\n");
        write_step_metric(buf, &open, it, &m, t);
        if let (Some(dur), Some(id)) = (dur, &id) {
            write_step_span(buf, &open, it, dur, id, "megatron", t);
            self.sync.push((label, it, t));
            self.counts.spans += 1;
        }
        self.streams[si].open = open;
        self.counts.logs += 1;
        self.counts.metrics += 1;
        self.counts.megatron += 1;
        Ok(true)
    }

    /// A DeepSpeed logger line (`[date time] [LEVEL] [file:line:func] …`) with a progress or timer message, as
    /// `DeepSpeedParser` reads it; everything else that starts with `[` is given back.
    fn deepspeed_line(
        &mut self,
        py: Python<'_>,
        si: usize,
        label: Option<u32>,
        text: &[u8],
        ids: &[usize],
    ) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.deepspeed, ids)?;
        {
            let st = &self.streams[si];
            // Python's head parser tries its last layout first: only these read a DeepSpeed head as "deepspeed" does.
            if st.out.is_none() || st.rank_guessed || st.last_layout == LAYOUT_OTHER {
                return Err(GiveBack);
            }
        }
        let (h, ts, day) = self.ds_stamp(text).ok_or(GiveBack)?;
        let body = &text[h.body_at..];
        if body.len() > self.cap || !printable(body) || !printable(h.logger) {
            return Err(GiveBack);
        }
        let body_s = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        // `[Rank N] ` (log_dist): routes nothing on a stream whose rank is known
        let rest = match body_s.strip_prefix("[Rank ") {
            Some(r) => {
                let r2 = r.strip_prefix('-').unwrap_or(r);
                let nd = r2.bytes().take_while(u8::is_ascii_digit).count();
                if nd > 0 && r2[nd..].starts_with("] ") { &r2[nd + 2..] } else { body_s }
            }
            None => body_s,
        };
        let events = if let Some(c) = self.c.ds_progress_rx.captures(rest) {
            self.ds_progress(py, si, ts, &c)?
        } else if let Some(c) = self.c.ds_timers_rx.captures(rest) {
            let items = c.get(1).unwrap().as_str().to_string();
            self.ds_timers(py, si, ts, &items)?
        } else {
            return Err(GiveBack); // throughput, overflow, loss scale, launcher lines: Python's
        };
        // Written: the line itself, then the parser's events.
        let (out, offset, open) = self.begin_write(si, ts, ("deepspeed", day), LAYOUT_DEEPSPEED);
        let buf = self.out_buf(out);
        let t = ts + offset;
        buf.extend_from_slice(&open);
        buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"");
        buf.extend_from_slice(h.level.unwrap_or("INFO").as_bytes());
        buf.extend_from_slice(b"\",\"msg\":");
        json_str(buf, body);
        if !h.logger.is_empty() {
            buf.extend_from_slice(b",\"logger\":");
            json_str(buf, h.logger);
        }
        buf.extend_from_slice(b",\"ts\":");
        push_int(buf, t);
        buf.extend_from_slice(b"}\n");
        let mut spans = 0u64;
        let mut metrics = 0u64;
        for ev in &events {
            buf.extend_from_slice(&open);
            match ev {
                DsEvent::Metric { step, metrics: m } => {
                    buf.extend_from_slice(b"\"kind\":\"metric\",");
                    match step {
                        // progress: {"kind","step","metrics"}; timers: {"kind","metrics","step"}
                        Some((st, true)) => {
                            buf.extend_from_slice(b"\"step\":");
                            push_int(buf, *st);
                            buf.extend_from_slice(b",\"metrics\":");
                            write_metrics(buf, m);
                        }
                        Some((st, false)) => {
                            buf.extend_from_slice(b"\"metrics\":");
                            write_metrics(buf, m);
                            buf.extend_from_slice(b",\"step\":");
                            push_int(buf, *st);
                        }
                        None => {
                            buf.extend_from_slice(b"\"metrics\":");
                            write_metrics(buf, m);
                        }
                    }
                    buf.extend_from_slice(b",\"ts\":");
                    push_int(buf, t);
                    metrics += 1;
                }
                DsEvent::StepSpan { step, dur, id, source } => {
                    buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"step\",\"name\":\"step\",\"step\":");
                    push_int(buf, *step);
                    buf.extend_from_slice(b",\"ts\":");
                    push_int(buf, t);
                    buf.extend_from_slice(b",\"start\":");
                    push_int(buf, ts - dur + offset);
                    buf.extend_from_slice(b",\"dur\":");
                    push_int(buf, *dur);
                    buf.extend_from_slice(b",\"span_id\":\"");
                    buf.extend_from_slice(id.as_bytes());
                    buf.extend_from_slice(b"\",\"attrs\":{\"source\":\"");
                    buf.extend_from_slice(source.as_bytes());
                    buf.extend_from_slice(b"\"}");
                    spans += 1;
                }
                DsEvent::Part { step, name, cat, start, dur, id, parent, collective } => {
                    buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"");
                    buf.extend_from_slice(cat.as_bytes());
                    buf.extend_from_slice(b"\",\"name\":\"");
                    buf.extend_from_slice(name.as_bytes());
                    buf.extend_from_slice(b"\",\"step\":");
                    push_int(buf, *step);
                    buf.extend_from_slice(b",\"start\":");
                    push_int(buf, start + offset);
                    buf.extend_from_slice(b",\"dur\":");
                    push_int(buf, *dur);
                    buf.extend_from_slice(b",\"ts\":");
                    push_int(buf, start + dur + offset);
                    buf.extend_from_slice(b",\"span_id\":\"");
                    buf.extend_from_slice(id.as_bytes());
                    buf.push(b'"');
                    if let Some(p) = parent {
                        buf.extend_from_slice(b",\"parent_id\":");
                        json_str(buf, p.as_bytes());
                    }
                    if *collective {
                        buf.extend_from_slice(b",\"attrs\":{\"op\":\"all_reduce\",\"group\":\"default\",\"seq\":");
                        push_int(buf, *step);
                        buf.extend_from_slice(b",\"source\":\"deepspeed-timers\"}");
                    }
                    spans += 1;
                }
            }
            buf.extend_from_slice(b"}\n");
        }
        for ev in &events {
            if let DsEvent::StepSpan { step, source: "deepspeed", .. } = ev {
                self.sync.push((label, *step, t));
            }
        }
        self.streams[si].open = open;
        self.counts.logs += 1;
        self.counts.metrics += metrics;
        self.counts.spans += spans;
        self.counts.deepspeed += 1;
        Ok(true)
    }

    /// `DeepSpeedParser._progress`; reads and updates the stream's parser state (nothing is written yet).
    fn ds_progress(&mut self, py: Python<'_>, si: usize, ts: i64, c: &regex::Captures<'_>) -> Result<Vec<DsEvent>, GiveBack> {
        let step: i64 = c[1].parse().map_err(|_| GiveBack)?;
        let skipped: i64 = c[2].parse().map_err(|_| GiveBack)?;
        let mut m: Vec<(String, String)> = vec![("skipped_steps".into(), json_float(skipped as f64).ok_or(GiveBack)?)];
        let lr = c[3].trim_matches(|ch| ch == ' ' || ch == '[' || ch == ']');
        if !lr.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
            return Err(GiveBack); // `float()` of anything else: Python's
        }
        if let Ok(v) = lr.parse::<f64>() {
            m.push(("lr".into(), metric_json(v)?));
        }
        let state = self.streams[si].deepspeed_state.clone_ref(py);
        let state = state.bind(py);
        let prev_step = get_int(state, "step")?;
        let prev_ts = get_int(state, "ts")?;
        let mut events = vec![DsEvent::Metric { step: Some((step, true)), metrics: m }];
        if let (Some(ps), Some(pt)) = (prev_step, prev_ts) {
            if step > ps {
                let dur = (ts - pt).div_euclid(step - ps);
                if dur > 0 {
                    let id = self.new_span_id();
                    state.set_item("span", &id).map_err(|_| GiveBack)?;
                    events.push(DsEvent::StepSpan { step, dur, id, source: "deepspeed" });
                }
            }
        }
        state.set_item("step", step).map_err(|_| GiveBack)?;
        state.set_item("ts", ts).map_err(|_| GiveBack)?;
        state.set_item("timed", false).map_err(|_| GiveBack)?;
        Ok(events)
    }

    /// `DeepSpeedParser._timers`; reads and updates the stream's parser state (nothing is written yet).
    fn ds_timers(&mut self, py: Python<'_>, si: usize, ts: i64, items: &str) -> Result<Vec<DsEvent>, GiveBack> {
        let mut values: Vec<(String, f64)> = Vec::new();
        for c in self.c.ds_item_rx.captures_iter(items) {
            let Ok(v) = c[2].parse::<f64>() else { continue };
            match values.iter_mut().find(|(k, _)| k == &c[1]) {
                Some(e) => e.1 = v,
                None => values.push((c[1].to_string(), v)),
            }
        }
        let mut m = Vec::with_capacity(values.len());
        for (k, v) in &values {
            m.push((format!("timer_ms/{k}"), metric_json(*v)?));
        }
        let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|e| e.1);
        let state = self.streams[si].deepspeed_state.clone_ref(py);
        let state = state.bind(py);
        let mut step = get_int(state, "step")?;
        let mut events = Vec::new();
        if get("fwd").is_some() || get("bwd").is_some() || get("step").is_some() {
            let timed = match state.get_item("timed").map_err(|_| GiveBack)? {
                Some(v) => v.is_truthy().map_err(|_| GiveBack)?,
                None => false,
            };
            let own_span: Option<String>;
            let s = match step {
                Some(v) if !timed => {
                    own_span = match state.get_item("span").map_err(|_| GiveBack)? {
                        None => None,
                        Some(v) if v.is_none() => None,
                        Some(v) => Some(v.extract::<String>().map_err(|_| GiveBack)?),
                    };
                    v
                }
                _ => {
                    own_span = None;
                    let base = match step {
                        Some(v) => v,
                        None => get_int(state, "timer_step")?.unwrap_or(-1),
                    };
                    base + 1
                }
            };
            let ms = 1e6;
            let allreduce = get("bwd_allreduce").unwrap_or(0.0);
            let backward = get("bwd_inner").unwrap_or_else(|| (get("bwd").unwrap_or(0.0) - allreduce).max(0.0));
            let mut parts = Vec::new();
            for (name, cat, v, coll) in [
                ("forward", "phase", get("fwd").unwrap_or(0.0), false),
                ("backward", "phase", backward, false),
                ("all_reduce", "collective", allreduce, true),
                ("optimizer", "phase", get("step").unwrap_or(0.0), false),
            ] {
                let x = v * ms;
                if x.is_nan() || x.abs() >= 9e18 {
                    return Err(GiveBack);
                }
                parts.push((name, cat, x as i64, coll));
            }
            // From here on the state changes: nothing is given back.
            if step.is_none() || timed {
                state.set_item("timer_step", s).map_err(|_| GiveBack)?;
            }
            state.set_item("timed", true).map_err(|_| GiveBack)?;
            step = Some(s);
            let mut parent = own_span;
            if parent.is_none() {
                let total: i64 = parts.iter().map(|p| p.2).sum();
                if total > 0 {
                    let id = self.new_span_id();
                    parent = Some(id.clone());
                    events.push(DsEvent::StepSpan { step: s, dur: total, id, source: "deepspeed-timers" });
                }
            }
            let kept: Vec<_> = parts.into_iter().filter(|p| p.2 > 0).collect();
            let mut at = ts - kept.iter().map(|p| p.2).sum::<i64>();
            for (name, cat, dur, coll) in kept {
                let id = self.new_span_id();
                events.push(DsEvent::Part {
                    step: s,
                    name,
                    cat,
                    start: at,
                    dur,
                    id,
                    parent: parent.clone().filter(|p| !p.is_empty()),
                    collective: coll,
                });
                at += dur;
            }
        }
        events.insert(0, DsEvent::Metric { step: step.map(|v| (v, false)), metrics: m });
        Ok(events)
    }

    /// A moment of the alignment pass: a strict-head line whose only sync parser is the generic one,
    /// read as `GenericStepParser.sync_step` reads it; `Ok(None)`: not a moment.
    fn sync_line(&mut self, raw: &[u8], ids: &[usize]) -> Result<Option<(Option<u32>, i64, i64)>, GiveBack> {
        let (label, text) = self.split_label(raw)?;
        if ids.first().is_some_and(|&i| Some(i) == self.c.megatron) && text.starts_with(b" [") {
            // MegatronParser.sync_step on a bracket-iso head: the first sync parser, so its answer stands
            let (ts, day, at) = megatron_head(text, self.tz_offset_s).ok_or(GiveBack)?;
            let body = std::str::from_utf8(&text[at..]).map_err(|_| GiveBack)?;
            if !body.is_ascii() {
                return Err(GiveBack);
            }
            let (it, _, _) = megatron_iter(body).ok_or(GiveBack)?;
            self.sync_days.insert(label, ("bracket-iso", day));
            self.sync_layouts.insert(label, LAYOUT_OTHER);
            return Ok(Some((label, it, ts)));
        }
        if ids.first().is_some_and(|&i| Some(i) == self.c.deepspeed) && text.first() == Some(&b'[') {
            // DeepSpeedParser.sync_step, then (a timer line) the generic one, on a "deepspeed" head
            if !ids.iter().all(|&i| Some(i) == self.c.deepspeed || Some(i) == self.c.generic)
                || self.sync_layouts.get(&label).copied().unwrap_or(LAYOUT_NONE) == LAYOUT_OTHER
            {
                return Err(GiveBack);
            }
            let (h, ts, day) = self.ds_stamp(text).ok_or(GiveBack)?;
            let body = &text[h.body_at..];
            if !printable(body) {
                return Err(GiveBack);
            }
            let body = std::str::from_utf8(body).map_err(|_| GiveBack)?;
            let step = match self.c.ds_progress_rx.captures(body) {
                Some(c) => Some(c[1].parse::<i64>().map_err(|_| GiveBack)?),
                None if ids.len() > 1 => match find_step(body)? {
                    Some((st, after)) => next_pair(body, after)?.map(|_| st),
                    None => None,
                },
                None => None,
            };
            self.sync_days.insert(label, ("deepspeed", day));
            self.sync_layouts.insert(label, LAYOUT_DEEPSPEED);
            return Ok(step.map(|st| (label, st, ts)));
        }
        if ids != [self.c.generic.ok_or(GiveBack)?] {
            return Err(GiveBack);
        }
        let h = strict_head(text).ok_or(GiveBack)?;
        let (ts, day) = self.stamp(&h).ok_or(GiveBack)?;
        let body = &text[h.body_at..];
        if !body.iter().all(|&c| (0x20..0x7f).contains(&c) || c == b'\t') {
            return Err(GiveBack);
        }
        let text = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        self.sync_days.insert(label, ("iso", day));
        self.sync_layouts.insert(label, LAYOUT_ISO);
        let Some((step, after)) = find_step(text)? else { return Ok(None) };
        Ok(next_pair(text, after)?.map(|_| (label, step, ts)))
    }

    /// A strict Python logging line that no parser wants: one log event, spliced as `_plain_line` writes it.
    fn plain(&mut self, si: usize, (ts, day): (i64, i64), h: &Head<'_>, body: &[u8]) -> Result<bool, GiveBack> {
        if body.len() > self.cap {
            return Err(GiveBack);
        }
        if !self.streams[si].pending.is_empty() {
            // As the Python engine's general path: pending lines first, then the line as an event dict.
            self.release(si, ts);
            let s = &mut self.streams[si];
            s.last_ts = Some(s.last_ts.map_or(ts, |l| l.max(ts)));
            s.head_note = Some(("iso", day));
            s.last_layout = LAYOUT_ISO;
            let (offset, out) = (s.offset, s.out.expect("checked in line()"));
            let open = std::mem::take(&mut s.open);
            let buf = self.out_buf(out);
            write_log_dict(buf, &open, ts + offset, h.level, h.logger, body);
            self.streams[si].open = open;
        } else {
            let s = &mut self.streams[si];
            s.last_ts = Some(ts);
            s.head_note = Some(("iso", day));
            s.last_layout = LAYOUT_ISO;
            let (offset, out) = (s.offset, s.out.expect("checked in line()"));
            let ident = std::mem::take(&mut s.ident);
            let buf = self.out_buf(out);
            write_log_line(buf, ts + offset, &ident, h.level, h.logger, body);
            self.streams[si].ident = ident;
        }
        self.counts.logs += 1;
        Ok(true)
    }

    fn role(&mut self, py: Python<'_>, key: &str, unit: Option<&str>) -> Result<Role, GiveBack> {
        let u = match unit {
            None => 0,
            Some(u) => 1 + UNITS.iter().position(|x| *x == u).ok_or(GiveBack)?,
        };
        if let Some(Some(r)) = self.roles.get(key).map(|slots| &slots[u]) {
            return Ok(r.clone());
        }
        let res = self.role_fn.call1(py, (key, unit)).map_err(|_| GiveBack)?;
        let (role, name, scale): (Option<String>, String, f64) = res.extract(py).map_err(|_| GiveBack)?;
        let r = match role.as_deref() {
            None => Role::Ignore,
            Some("metric") => Role::Metric(name),
            Some("step") => Role::StepDur(scale),
            Some("phase") => Role::Phase(name, scale),
            Some("collective") => Role::Collective(name, scale),
            Some(_) => Role::Other,
        };
        if self.roles.len() < 4096 {
            self.roles.entry(key.to_string()).or_default()[u] = Some(r.clone());
        }
        Ok(r)
    }

    /// A span id as `new_span_id()` of the parsers makes it.
    fn new_span_id(&mut self) -> String {
        let n = self.next_span_id;
        self.next_span_id += 1;
        format!("{:016x}", (0x6a74u64 << 48) | n)
    }

    /// A step line of the generic parser (`ingest/parsers/generic.py`), for the lines whose every pair
    /// it can write exactly; its events spliced as the Python engine's `_write` encodes them.
    #[allow(clippy::too_many_arguments)]
    fn step_line(
        &mut self,
        py: Python<'_>,
        si: usize,
        label: Option<u32>,
        (ts, day): (i64, i64),
        h: &Head<'_>,
        body: &[u8],
    ) -> Result<bool, GiveBack> {
        // Outside printable ASCII (and tab), `\w`, `\s` and case folding differ between Python and Rust.
        if body.len() > self.cap || !body.iter().all(|&c| (0x20..0x7f).contains(&c) || c == b'\t') {
            return Err(GiveBack);
        }
        let text = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        let (step, after) = find_step(text)?.ok_or(GiveBack)?;
        let mut metrics: Vec<(String, String)> = Vec::new();
        let mut phases: Vec<(String, bool, i64)> = Vec::new();
        let mut step_ns: Option<i64> = None;
        let mut at = after;
        while let Some(pair) = next_pair(text, at)? {
            at = pair.end;
            let (key, raw, unit) = (&text[pair.key.0..pair.key.1], &text[pair.val.0..pair.val.1], pair.unit);
            let value = py_float(raw).ok_or(GiveBack)?;
            match self.role(py, key, unit)? {
                Role::Ignore => {}
                Role::Other => return Err(GiveBack),
                Role::Metric(name) => {
                    let v = if value.is_nan() {
                        "\"NaN\"".to_string()
                    } else if value.is_infinite() {
                        if value > 0.0 { "\"Infinity\"".into() } else { "\"-Infinity\"".into() }
                    } else {
                        json_float(value).ok_or(GiveBack)?
                    };
                    match metrics.iter_mut().find(|(k, _)| *k == name) {
                        Some(e) => e.1 = v,
                        None => metrics.push((name, v)),
                    }
                }
                Role::StepDur(scale) | Role::Phase(_, scale) | Role::Collective(_, scale)
                    if value.is_nan() || value.abs() >= 1e12 || value * scale <= -1.0 =>
                {
                    let _ = scale; // `int(value * scale)` is None or negative: the pair is skipped
                }
                Role::StepDur(scale) | Role::Phase(_, scale) | Role::Collective(_, scale)
                    if (value * scale).abs() >= 9e18 =>
                {
                    let _ = scale;
                    return Err(GiveBack); // past i64: Python's int is exact there
                }
                Role::StepDur(scale) => step_ns = Some((value * scale) as i64),
                Role::Phase(name, scale) => phases.push((name, false, (value * scale) as i64)),
                Role::Collective(name, scale) => phases.push((name, true, (value * scale) as i64)),
            }
        }
        if metrics.is_empty() && phases.is_empty() && step_ns.is_none() {
            return Err(GiveBack);
        }
        if step_ns.is_none() && !phases.is_empty() {
            step_ns = Some(phases.iter().map(|p| p.2).sum());
        }
        let Some(step_ns) = step_ns else { return Err(GiveBack) }; // from the previous step line: Python's
        // Nothing can be given back from here on: state and output change.
        {
            let st = self.streams[si].generic_state.bind(py);
            st.set_item("step", step).map_err(|_| GiveBack)?;
            st.set_item("ts", ts).map_err(|_| GiveBack)?;
        }
        let mut ids = Vec::new();
        if step_ns > 0 {
            ids.push(self.new_span_id());
            for p in &phases {
                if p.2 > 0 {
                    ids.push(self.new_span_id());
                }
            }
        }
        let (out, offset, open) = self.begin_write(si, ts, ("iso", day), LAYOUT_ISO);
        let buf = self.out_buf(out);
        let t = ts + offset;
        write_log_dict(buf, &open, t, h.level, h.logger, body); // the line itself, as `_parse` adds it
        let mut spans = 0u64;
        if !metrics.is_empty() {
            write_step_metric(buf, &open, step, &metrics, t);
        }
        if step_ns > 0 {
            let parent = &ids[0];
            write_step_span(buf, &open, step, step_ns, parent, "log", t);
            spans += 1;
            let total: i64 = phases.iter().filter(|p| p.2 > 0).map(|p| p.2).sum();
            let mut rel = -total;
            for (k, (name, coll, dur)) in phases.iter().filter(|p| p.2 > 0).enumerate().map(|(i, p)| (i + 1, p)) {
                buf.extend_from_slice(&open);
                buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":");
                buf.extend_from_slice(if *coll { b"\"collective\"" } else { b"\"phase\"" });
                buf.extend_from_slice(b",\"name\":");
                json_str(buf, name.as_bytes());
                buf.extend_from_slice(b",\"step\":");
                push_int(buf, step);
                buf.extend_from_slice(b",\"dur\":");
                push_int(buf, *dur);
                buf.extend_from_slice(b",\"span_id\":\"");
                buf.extend_from_slice(ids[k].as_bytes());
                buf.extend_from_slice(b"\",\"parent_id\":\"");
                buf.extend_from_slice(parent.as_bytes());
                buf.push(b'"');
                if *coll {
                    buf.extend_from_slice(b",\"attrs\":{\"op\":");
                    json_str(buf, name.as_bytes());
                    buf.extend_from_slice(b",\"group\":\"default\",\"seq\":");
                    push_int(buf, step);
                    buf.extend_from_slice(b",\"source\":\"log\"}");
                }
                buf.extend_from_slice(b",\"start\":");
                push_int(buf, ts + rel + offset);
                buf.extend_from_slice(b",\"ts\":");
                push_int(buf, ts + rel + dur + offset);
                buf.extend_from_slice(b"}\n");
                rel += dur;
                spans += 1;
            }
            self.sync.push((label, step, t));
        }
        self.streams[si].open = open;
        self.counts.logs += 1;
        self.counts.metrics += !metrics.is_empty() as u64;
        self.counts.spans += spans;
        self.counts.generic += 1;
        Ok(true)
    }
}

/// The keys of a dict, in order, as strings (`None` if one is not a string).
fn keys_of(d: &Bound<'_, PyDict>) -> Option<Vec<String>> {
    d.keys().iter().map(|k| k.extract::<String>().ok()).collect()
}

fn item<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> Option<T> {
    d.get_item(key).ok().flatten()?.extract::<T>().ok()
}

/// `_KEYS` of `ingest/parsers/huggingface.py`: the Trainer's names that the events shorten.
fn hf_name(key: &str) -> &str {
    match key {
        "learning_rate" => "lr",
        "train_samples_per_second" => "train_samples_per_s",
        "train_steps_per_second" => "train_steps_per_s",
        k => k,
    }
}

/// A plain decimal number at the start of `t`, as `repr()` of a float or an int and `f"{v:.4g}"` print them:
/// `-?(0|[1-9]\d{0,19})(\.\d{1,24})?([eE][-+]?\d{1,3})?`; `(its end, whether it is an int)`. Leading zeros
/// (a syntax error for `ast.literal_eval`), underscores, `nan`/`inf` and long digit runs (past the int-to-str
/// limit, or a float of an int that overflows) are left out: those lines are Python's.
fn plain_number(t: &[u8]) -> Option<(usize, bool)> {
    let run = |from: usize| t[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = usize::from(t.first() == Some(&b'-'));
    let int = run(i);
    if int == 0 || int > 20 || (int > 1 && t[i] == b'0') {
        return None;
    }
    i += int;
    let mut is_int = true;
    if t.get(i) == Some(&b'.') {
        let frac = run(i + 1);
        if frac == 0 || frac > 24 {
            return None;
        }
        i += 1 + frac;
        is_int = false;
    }
    if matches!(t.get(i), Some(b'e') | Some(b'E')) {
        i += 1;
        if matches!(t.get(i), Some(b'+') | Some(b'-')) {
            i += 1;
        }
        let exp = run(i);
        if exp == 0 || exp > 3 {
            return None;
        }
        i += exp;
        is_int = false;
    }
    Some((i, is_int))
}

/// The metrics of a line that is exactly a Trainer metric dict, `{'key': value, 'key2': value2}` with keys
/// `[A-Za-z_][A-Za-z0-9_/.-]*`, each once, and values that are plain numbers (`plain_number`), bare or
/// single-quoted: what `ast.literal_eval` and `number()` make of it, renamed (`_KEYS`; a name met again keeps
/// its first place and takes the last value, as a dict does). `None` for any other shape or a value whose JSON
/// text could differ (`json_float`); `_DICT.search` finds this whole line as the blob.
fn hf_dict(t: &[u8]) -> Option<Vec<(String, f64)>> {
    if t.first() != Some(&b'{') || t.last() != Some(&b'}') {
        return None;
    }
    let mut raw: Vec<(&str, f64)> = Vec::new();
    let mut i = 1;
    loop {
        if t.get(i) != Some(&b'\'') || !t.get(i + 1).is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_') {
            return None;
        }
        let k0 = i + 1;
        let mut k = k0 + 1;
        while k < t.len() && (is_word(t[k]) || matches!(t[k], b'/' | b'.' | b'-')) {
            k += 1;
        }
        if !t[k..].starts_with(b"': ") {
            return None;
        }
        let key = std::str::from_utf8(&t[k0..k]).ok()?;
        if raw.iter().any(|(seen, _)| *seen == key) {
            return None; // a key given twice: the dict keeps its first place and last value; rare, Python's
        }
        let quoted = t.get(k + 3) == Some(&b'\'');
        let v0 = k + 3 + usize::from(quoted);
        let (len, is_int) = plain_number(&t[v0..])?;
        let mut x: f64 = std::str::from_utf8(&t[v0..v0 + len]).ok()?.parse().ok()?;
        if is_int && !quoted && x == 0.0 {
            x = 0.0; // `-0` is the int 0, whose float is 0.0 (a string "-0" is float -0.0)
        }
        if !x.is_finite() || json_float(x).is_none() {
            return None; // `1e999` (metric_value's "Infinity") or a float orjson writes with an exponent
        }
        raw.push((key, x));
        i = v0 + len;
        if quoted {
            if t.get(i) != Some(&b'\'') {
                return None;
            }
            i += 1;
        }
        if i == t.len() - 1 {
            break; // the closing brace
        }
        if !t[i..].starts_with(b", ") {
            return None;
        }
        i += 2;
    }
    let mut metrics: Vec<(String, f64)> = Vec::with_capacity(raw.len());
    for (key, x) in raw {
        let name = hf_name(key);
        match metrics.iter_mut().find(|(k, _)| k == name) {
            Some(e) => e.1 = x,
            None => metrics.push((name.to_string(), x)),
        }
    }
    Some(metrics)
}

/// A pending event dict of a kind the lane writes, as `write_pending` writes it (exact keys and order).
fn pending_of(ev: &Bound<'_, PyDict>) -> Option<Pending> {
    let keys = keys_of(ev)?;
    let k: Vec<&str> = keys.iter().map(String::as_str).collect();
    let exact_int = |v: &Bound<'_, PyAny>| v.is_exact_instance_of::<pyo3::types::PyInt>();
    match k.as_slice() {
        ["kind", "level", "msg"] => {
            if item::<String>(ev, "kind")? != "log" || item::<String>(ev, "level")? != "INFO" {
                return None;
            }
            Some(Pending::Print { msg: item::<String>(ev, "msg")? })
        }
        ["kind", "level", "logger", "msg", "attrs"] => {
            if item::<String>(ev, "kind")? != "log" || item::<String>(ev, "logger")? != "nccl" {
                return None;
            }
            let level = match item::<String>(ev, "level")?.as_str() {
                "INFO" => "INFO",
                "WARNING" => "WARNING",
                "DEBUG" => "DEBUG",
                _ => return None,
            };
            let a = ev.get_item("attrs").ok().flatten()?.cast_into::<PyDict>().ok()?;
            let ak = keys_of(&a)?;
            let with_src = match ak.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                ["nccl_host", "nccl_pid", "tid", "cuda_dev"] => false,
                ["nccl_host", "nccl_pid", "tid", "cuda_dev", "src"] => true,
                _ => return None,
            };
            for key in ["nccl_pid", "tid", "cuda_dev"] {
                if !exact_int(&a.get_item(key).ok().flatten()?) {
                    return None;
                }
            }
            Some(Pending::Nccl {
                level,
                msg: item::<String>(ev, "msg")?,
                host: item::<String>(&a, "nccl_host")?,
                pid: item::<i64>(&a, "nccl_pid")?,
                tid: item::<i64>(&a, "tid")?,
                dev: item::<i64>(&a, "cuda_dev")?,
                src: if with_src { Some(item::<String>(&a, "src")?) } else { None },
            })
        }
        ["kind", "metrics"] | ["kind", "metrics", "step"] | ["kind", "metrics", "attrs", "step"] => {
            if item::<String>(ev, "kind")? != "metric" {
                return None;
            }
            let m = ev.get_item("metrics").ok().flatten()?.cast_into::<PyDict>().ok()?;
            let mut metrics = Vec::with_capacity(m.len());
            for (key, v) in m.iter() {
                // floats only (NaN and infinities are strings there), each one that json_float writes
                if !v.is_exact_instance_of::<pyo3::types::PyFloat>() {
                    return None;
                }
                let x: f64 = v.extract().ok()?;
                json_float(x)?;
                metrics.push((key.extract::<String>().ok()?, x));
            }
            let estimated = k.len() == 4;
            if estimated {
                let a = ev.get_item("attrs").ok().flatten()?.cast_into::<PyDict>().ok()?;
                let flag = a.get_item("step_estimated").ok().flatten()?;
                if a.len() != 1 || !flag.is_exact_instance_of::<pyo3::types::PyBool>() || !flag.is_truthy().ok()? {
                    return None;
                }
            }
            let step = match ev.get_item("step").ok().flatten() {
                Some(v) if exact_int(&v) => Some(v.extract::<i64>().ok()?),
                Some(_) => return None,
                None => None,
            };
            Some(Pending::DictMetric { metrics, step, estimated })
        }
        _ => None,
    }
}

/// An event of a DeepSpeed line, before it is written.
enum DsEvent {
    /// `step`: `(step, written before the metrics)`.
    Metric { step: Option<(i64, bool)>, metrics: Vec<(String, String)> },
    StepSpan { step: i64, dur: i64, id: String, source: &'static str },
    Part {
        step: i64,
        name: &'static str,
        cat: &'static str,
        start: i64,
        dur: i64,
        id: String,
        parent: Option<String>,
        collective: bool,
    },
}

/// `{"kind":"metric","step":…,"metrics":{…},"ts":…}`: a parser's metric event without a time of its own.
fn write_step_metric(buf: &mut Vec<u8>, open: &[u8], step: i64, m: &[(String, String)], ts: i64) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"metric\",\"step\":");
    push_int(buf, step);
    buf.extend_from_slice(b",\"metrics\":");
    write_metrics(buf, m);
    buf.extend_from_slice(b",\"ts\":");
    push_int(buf, ts);
    buf.extend_from_slice(b"}\n");
}

/// A step span ending at the line's time `ts` (offset applied), as `_write` completes `step_span(…)` without
/// `ts`/`start`: `{"kind":"span","cat":"step","name":"step","step","dur","span_id","attrs":{"source"},"start","ts"}`.
fn write_step_span(buf: &mut Vec<u8>, open: &[u8], step: i64, dur: i64, id: &str, source: &str, ts: i64) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"step\",\"name\":\"step\",\"step\":");
    push_int(buf, step);
    buf.extend_from_slice(b",\"dur\":");
    push_int(buf, dur);
    buf.extend_from_slice(b",\"span_id\":\"");
    buf.extend_from_slice(id.as_bytes());
    buf.extend_from_slice(b"\",\"attrs\":{\"source\":\"");
    buf.extend_from_slice(source.as_bytes());
    buf.extend_from_slice(b"\"},\"start\":");
    push_int(buf, ts - dur);
    buf.extend_from_slice(b",\"ts\":");
    push_int(buf, ts);
    buf.extend_from_slice(b"}\n");
}

fn write_metrics(buf: &mut Vec<u8>, m: &[(String, String)]) {
    buf.push(b'{');
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        json_str(buf, k.as_bytes());
        buf.push(b':');
        buf.extend_from_slice(v.as_bytes());
    }
    buf.push(b'}');
}

/// `metric_value(v)` as JSON: NaN and infinities as the strings the analysis reads.
fn metric_json(v: f64) -> Result<String, GiveBack> {
    if v.is_nan() {
        Ok("\"NaN\"".into())
    } else if v.is_infinite() {
        Ok(if v > 0.0 { "\"Infinity\"".into() } else { "\"-Infinity\"".into() })
    } else {
        json_float(v).ok_or(GiveBack)
    }
}

/// `_seconds`: `H:M:S` (any number of parts) as seconds; `None` when a part is empty (not an int).
fn seconds(text: &str) -> Result<Option<f64>, GiveBack> {
    let mut total: i64 = 0;
    for p in text.split(':') {
        if p.is_empty() {
            return Ok(None);
        }
        if p.len() > 12 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(GiveBack); // huge, or digits `int()` reads and Rust does not
        }
        total = total.checked_mul(60).and_then(|v| v.checked_add(p.parse::<i64>().ok()?)).ok_or(GiveBack)?;
    }
    Ok(Some(total as f64))
}

/// A float (or None) of a parser's state dict; anything else is given back.
fn get_float(d: &Bound<'_, PyDict>, key: &str) -> Result<Option<f64>, GiveBack> {
    match d.get_item(key).map_err(|_| GiveBack)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => {
            if !v.is_instance_of::<pyo3::types::PyFloat>() {
                return Err(GiveBack);
            }
            v.extract::<f64>().map(Some).map_err(|_| GiveBack)
        }
    }
}

/// An int (or None) of a parser's state dict; anything else is given back.
fn get_int(d: &Bound<'_, PyDict>, key: &str) -> Result<Option<i64>, GiveBack> {
    match d.get_item(key).map_err(|_| GiveBack)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => {
            if v.is_instance_of::<pyo3::types::PyBool>() {
                return Err(GiveBack);
            }
            v.extract::<i64>().map(Some).map_err(|_| GiveBack)
        }
    }
}

/// The "bracket-iso" head of a Megatron iteration line: ` ?\[DATE[ T_]TIME(?:[.,]\d{1,9})?\] ?` followed by
/// `iteration`, where the layout's optional level, logger and separator all fail (checked: none can start
/// at "iteration N"); `(UTC ns, epoch day, body start)`. A zone in the stamp: `None`.
fn megatron_head(t: &[u8], tz_offset_s: i64) -> Option<(i64, i64, usize)> {
    let b = if t.first() == Some(&b' ') { 1 } else { 0 };
    if !(t.get(b) == Some(&b'[') && digits(t, b + 1, 4) && t.get(b + 5) == Some(&b'-') && digits(t, b + 6, 2)
        && t.get(b + 8) == Some(&b'-') && digits(t, b + 9, 2) && matches!(t.get(b + 11), Some(b' ') | Some(b'T') | Some(b'_'))
        && digits(t, b + 12, 2) && t.get(b + 14) == Some(&b':') && digits(t, b + 15, 2) && t.get(b + 17) == Some(&b':')
        && digits(t, b + 18, 2))
    {
        return None;
    }
    let mut i = b + 20;
    let mut frac: &[u8] = &[];
    if matches!(t.get(i), Some(b'.') | Some(b',')) {
        let mut j = i + 1;
        while j < t.len() && t[j].is_ascii_digit() {
            j += 1;
        }
        if !(1..=9).contains(&(j - i - 1)) {
            return None;
        }
        frac = &t[i + 1..j];
        i = j;
    }
    if t.get(i) != Some(&b']') {
        return None;
    }
    i += 1;
    if t.get(i) == Some(&b' ') {
        i += 1;
    }
    let rest = &t[i..];
    // "iteration" then white space then a digit: no level, logger or separator of the layout's tail can match
    if !rest.starts_with(b"iteration") || !matches!(rest.get(9), Some(b' ')) {
        return None;
    }
    let (day, sod) = day_and_second(&t[b + 1..b + 11], &t[b + 12..b + 20])?;
    let f = if frac.is_empty() { 0 } else { num(frac) * FRAC_SCALE[frac.len()] };
    Some(((day * 86400 + sod - tz_offset_s) * 1_000_000_000 + f, day, i))
}

/// `iteration\s+(\d+)/\s*(\d+) \|` at the start of `body` (ASCII): `(it, total, end)`.
fn megatron_iter(body: &str) -> Option<(i64, i64, usize)> {
    let t = body.as_bytes();
    let mut i = "iteration".len();
    let s0 = i;
    while i < t.len() && matches!(t[i], b' ' | b'\t') {
        i += 1;
    }
    if i == s0 {
        return None;
    }
    let d0 = i;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    if i == d0 || t.get(i) != Some(&b'/') || i - d0 > 18 {
        return None;
    }
    let it = num(&t[d0..i]);
    i += 1;
    while i < t.len() && matches!(t[i], b' ' | b'\t') {
        i += 1;
    }
    let d1 = i;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    if i == d1 || i - d1 > 18 || !t[i..].starts_with(b" |") {
        return None;
    }
    Some((it, num(&t[d1..i]), i + 2))
}

fn megatron_key(key: &str) -> Option<&'static str> {
    Some(match key {
        "consumed samples" => "consumed_samples",
        "skipped samples" => "skipped_samples",
        "elapsed time per iteration (ms)" => "iter_ms",
        "throughput per GPU (TFLOP/s/GPU)" => "tflops_per_gpu",
        "energy per GPU (J/iter/GPU)" => "energy_j_per_gpu",
        "power per GPU (W/GPU)" => "power_w_per_gpu",
        "learning rate" => "lr",
        "decoupled learning rate" => "decoupled_lr",
        "global batch size" => "global_batch_size",
        "loss scale" => "loss_scale",
        "grad norm" => "grad_norm",
        "num zeros" => "num_zeros",
        "params norm" => "params_norm",
        "number of skipped iterations" => "skipped_iters",
        "number of nan iterations" => "nan_iters",
        _ => return None,
    })
}

/// `_metric_name`: runs of other than ASCII letters and digits become `_`, stripped, lower case; or "value".
fn metric_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut gap = false;
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_lowercase());
        } else {
            gap = true;
        }
    }
    if out.is_empty() {
        "value".into()
    } else {
        out
    }
}

struct DsHead<'a> {
    date: &'a [u8],
    tod: &'a [u8],
    frac: &'a [u8],
    level: Option<&'static str>,
    logger: &'a [u8],
    body_at: usize,
}

/// The "deepspeed" head layout: `\[DATE TIME(?:[.,]\d{1,9})?\] \[(?P<level>[A-Z]+)\] \[(?P<logger>[^\]]*)\] ?`.
/// Printable ASCII only (where Python's and Rust's character classes agree).
fn printable(b: &[u8]) -> bool {
    b.iter().all(|&c| (0x20..0x7f).contains(&c))
}

fn ds_head(t: &[u8]) -> Option<DsHead<'_>> {
    if !(t.first() == Some(&b'[') && digits(t, 1, 4) && t.get(5) == Some(&b'-') && digits(t, 6, 2)
        && t.get(8) == Some(&b'-') && digits(t, 9, 2) && t.get(11) == Some(&b' ') && digits(t, 12, 2)
        && t.get(14) == Some(&b':') && digits(t, 15, 2) && t.get(17) == Some(&b':') && digits(t, 18, 2))
    {
        return None;
    }
    let mut i = 20;
    let mut frac: &[u8] = &[];
    if matches!(t.get(i), Some(b'.') | Some(b',')) {
        let mut j = i + 1;
        while j < t.len() && t[j].is_ascii_digit() {
            j += 1;
        }
        if j - (i + 1) >= 1 && j - (i + 1) <= 9 && t.get(j) == Some(&b']') {
            frac = &t[i + 1..j];
            i = j;
        } else {
            return None;
        }
    }
    if !t[i..].starts_with(b"] [") {
        return None;
    }
    i += 3;
    let ls = i;
    while i < t.len() && t[i].is_ascii_uppercase() {
        i += 1;
    }
    if i == ls || !t[i..].starts_with(b"] [") {
        return None;
    }
    let word = &t[ls..i];
    let level = LEVELS.iter().find(|(w, _)| *w == word).map(|e| e.1).or(match word {
        b"I" => Some("INFO"),
        b"W" => Some("WARNING"),
        b"E" => Some("ERROR"),
        b"F" => Some("CRITICAL"),
        b"D" => Some("DEBUG"),
        _ => None,
    });
    i += 3;
    let gs = i;
    while i < t.len() && t[i] != b']' {
        i += 1;
    }
    if i >= t.len() {
        return None;
    }
    let logger = &t[gs..i];
    i += 1;
    if t.get(i) == Some(&b' ') {
        i += 1;
    }
    Some(DsHead { date: &t[1..11], tod: &t[12..20], frac, level, logger, body_at: i })
}

/// An NCCL debug line (`ncclDebugLogV`) as `ingest/parsers/torch_distributed.py`'s `_NCCL` reads it.
struct NcclLine<'a> {
    host: &'a str,
    pid: i64,
    tid: i64,
    dev: i64,
    src: Option<(&'a str, &'a str)>,
    lvl: &'a str,
    msg: &'a str,
}

/// `_NCCL` (`host:pid:tid [dev] (file:line ((func) )?)?NCCL LVL ?msg`) matched at the start of ASCII `t`; where
/// it does not match there, Python's search may find it further on: `None` (the line is given back). Each
/// part stops where the next must start, so the first way Python's backtracking tries is the one that matches,
/// except the optional source part, tried first and dropped when "NCCL" does not follow it.
fn nccl_at_start(t: &str) -> Option<NcclLine<'_>> {
    let b = t.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let run = |mut i: usize, f: &dyn Fn(u8) -> bool| {
        while i < b.len() && f(b[i]) {
            i += 1;
        }
        i
    };
    let h = run(0, &|c| word(c) || c == b'.' || c == b'-');
    if h == 0 || b.get(h) != Some(&b':') {
        return None;
    }
    let p = run(h + 1, &|c| c.is_ascii_digit());
    if p == h + 1 || b.get(p) != Some(&b':') || p - h > 18 {
        return None;
    }
    let q = run(p + 1, &|c| c.is_ascii_digit());
    if q == p + 1 || !t[q..].starts_with(" [") || q - p > 18 {
        return None;
    }
    let d0 = if b.get(q + 2) == Some(&b'-') { q + 3 } else { q + 2 };
    let d = run(d0, &|c| c.is_ascii_digit());
    if d == d0 || !t[d..].starts_with("] ") || d - d0 > 18 {
        return None;
    }
    let mut i = d + 2;
    let mut src = None;
    // (?:(file):(line) (?:\((func)\) )?)?
    let f = run(i, &|c| word(c) || matches!(c, b'.' | b'/' | b'-'));
    if f > i && b.get(f) == Some(&b':') {
        let l = run(f + 1, &|c| c.is_ascii_digit());
        if l > f + 1 && b.get(l) == Some(&b' ') {
            let mut j = l + 1;
            if b.get(j) == Some(&b'(') {
                if let Some(k) = t[j + 1..].find(')') {
                    if b.get(j + 1 + k + 1) == Some(&b' ') && t[j + 1 + k + 2..].starts_with("NCCL ") {
                        j = j + 1 + k + 2;
                    }
                }
            }
            if t[j..].starts_with("NCCL ") {
                src = Some((&t[i..f], &t[f + 1..l]));
                i = j;
            }
        }
    }
    let rest = t[i..].strip_prefix("NCCL ")?;
    let lvl = ["INFO", "WARN", "TRACE", "CALL", "ABORT"].into_iter().find(|l| rest.starts_with(l))?;
    let mut m = &rest[lvl.len()..];
    if let Some(x) = m.strip_prefix(' ') {
        m = x;
    }
    Some(NcclLine {
        host: &t[..h],
        pid: t[h + 1..p].parse().ok()?,
        tid: t[p + 1..q].parse().ok()?,
        dev: t[q + 2..d].parse().ok()?,
        src,
        lvl,
        msg: m,
    })
}

/// The generic parser's `_STEP` searched in printable-ASCII `text`:
/// `(?i)\b(global_step|step|iter|iteration)\b\s*[=:#]?\s*\[?(\d+)(?:\s*/\s*\d+)?`; `(step, end of match)`.
///
/// At each word start the names are tried in the pattern's order; after a name, the blanks, the separator
/// and the bracket are optional parts that only the greedy way can get past to a digit.
fn find_step(text: &str) -> Result<Option<(i64, usize)>, GiveBack> {
    let t = text.as_bytes();
    let n = t.len();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let blank = |i: usize| matches!(t.get(i), Some(b' ') | Some(b'\t'));
    for s in 0..n {
        if !t[s].is_ascii_alphabetic() || (s > 0 && word(t[s - 1])) {
            continue;
        }
        for name in ["global_step", "step", "iter", "iteration"] {
            let e = s + name.len();
            if e > n || !t[s..e].eq_ignore_ascii_case(name.as_bytes()) || (e < n && word(t[e])) {
                continue;
            }
            let mut j = e;
            while blank(j) {
                j += 1;
            }
            if matches!(t.get(j), Some(b'=') | Some(b':') | Some(b'#')) {
                j += 1;
            }
            while blank(j) {
                j += 1;
            }
            if t.get(j) == Some(&b'[') {
                j += 1;
            }
            let d0 = j;
            while j < n && t[j].is_ascii_digit() {
                j += 1;
            }
            if j == d0 {
                continue;
            }
            if j - d0 > 18 {
                return Err(GiveBack); // past i64: Python's int is exact there
            }
            let step = num(&t[d0..j]);
            let mut k = j;
            while blank(k) {
                k += 1;
            }
            let mut end = j;
            if t.get(k) == Some(&b'/') {
                k += 1;
                while blank(k) {
                    k += 1;
                }
                let k0 = k;
                while k < n && t[k].is_ascii_digit() {
                    k += 1;
                }
                if k > k0 {
                    end = k;
                }
            }
            return Ok(Some((step, end)));
        }
    }
    Ok(None)
}

/// One `key value[unit]` pair of a generic step line, as byte ranges of the text.
struct Pair {
    key: (usize, usize),
    val: (usize, usize),
    unit: Option<&'static str>,
    end: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The first number of `[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf|Infinity` at `v`, taking
/// each part as Python's backtracking first tries it (greedy); its end, or `None`.
fn number_at(t: &[u8], v: usize) -> Option<usize> {
    let digit = |i: usize| t.get(i).is_some_and(u8::is_ascii_digit);
    let mut q = v;
    if matches!(t.get(q), Some(b'+') | Some(b'-')) {
        q += 1;
    }
    let mut ok = false;
    if digit(q) {
        while digit(q) {
            q += 1;
        }
        if t.get(q) == Some(&b'.') {
            q += 1;
            while digit(q) {
                q += 1;
            }
        }
        ok = true;
    } else if t.get(q) == Some(&b'.') && digit(q + 1) {
        q += 1;
        while digit(q) {
            q += 1;
        }
        ok = true;
    }
    if ok {
        if matches!(t.get(q), Some(b'e') | Some(b'E')) {
            let mut r = q + 1;
            if matches!(t.get(r), Some(b'+') | Some(b'-')) {
                r += 1;
            }
            if digit(r) {
                while digit(r) {
                    r += 1;
                }
                q = r;
            }
        }
        return Some(q);
    }
    ["nan", "NaN", "inf", "-inf", "Infinity"].iter().find(|w| t[v..].starts_with(w.as_bytes())).map(|w| v + w.len())
}

/// The generic parser's `_PAIR` searched in printable-ASCII `text` from `at`, as Python's `re` finds it:
/// `(?P<key>[A-Za-z_][\w./-]*)(?:=|:?\s+)\[?(?P<val>number)\s?(?P<unit>ms|s|…)?(?![\w.])`.
///
/// Each part has one way to match that can lead anywhere (the key stops where the separator must start,
/// and so on), so the first way Python tries is the only one, except in the tail: there the blank, the
/// unit and the look-ahead are tried in Python's order. Where the tail fails every way, Python would go
/// back into the number; such a line is given back.
fn next_pair(text: &str, at: usize) -> Result<Option<Pair>, GiveBack> {
    let t = text.as_bytes();
    let n = t.len();
    let blank = |i: usize| matches!(t.get(i), Some(b' ') | Some(b'\t'));
    for s in at..n {
        if !(t[s].is_ascii_alphabetic() || t[s] == b'_') {
            continue;
        }
        let mut k = s + 1;
        while k < n && (is_word(t[k]) || matches!(t[k], b'.' | b'/' | b'-')) {
            k += 1;
        }
        let mut p = k;
        if t.get(p) == Some(&b'=') {
            p += 1;
        } else {
            if t.get(p) == Some(&b':') && blank(p + 1) {
                p += 1;
            }
            if !blank(p) {
                continue;
            }
            while blank(p) {
                p += 1;
            }
        }
        if t.get(p) == Some(&b'[') {
            p += 1;
        }
        let Some(v_end) = number_at(t, p) else { continue };
        let mut tail = None;
        'tail: for w in if blank(v_end) { &[1usize, 0][..] } else { &[0usize][..] } {
            let q = v_end + w;
            for u in UNITS {
                if text[q..].starts_with(u) && !word_follows(text, q + u.len()) {
                    tail = Some((q + u.len(), Some(u)));
                    break 'tail;
                }
            }
            if !word_follows(text, q) {
                tail = Some((q, None));
                break;
            }
        }
        let Some((end, unit)) = tail else { return Err(GiveBack) };
        return Ok(Some(Pair { key: (s, k), val: (p, v_end), unit, end }));
    }
    Ok(None)
}

/// Whether `(?![\w.])` fails at byte `at` of ASCII `text`.
fn word_follows(text: &str, at: usize) -> bool {
    text.as_bytes().get(at).is_some_and(|&c| c == b'.' || c == b'_' || c.is_ascii_alphanumeric())
}

/// `float()` of what the pair pattern admits.
fn py_float(raw: &str) -> Option<f64> {
    match raw {
        "nan" | "NaN" => Some(f64::NAN),
        "inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => raw.parse::<f64>().ok(),
    }
}

/// Whether a head layout of `ingest/_timestamps.py` may start with this character (its `_BY_FIRST`).
fn may_have_head(c: u8) -> bool {
    c.is_ascii_digit() || matches!(c, b'[' | b' ' | b'I' | b'W' | b'E' | b'F' | b'D' | b'C' | b'A' | b'J' | b'M' | b'N' | b'O' | b'S')
}

/// `" *(\d{1,6}): "` at the start: the rank and where the text starts.
fn srun_label(raw: &[u8]) -> Option<(u32, usize)> {
    let mut i = 0;
    while i < raw.len() && raw[i] == b' ' {
        i += 1;
    }
    let s = i;
    while i < raw.len() && raw[i].is_ascii_digit() && i - s < 7 {
        i += 1;
    }
    let nd = i - s;
    if nd == 0 || nd > 6 || !raw[i..].starts_with(b": ") {
        return None;
    }
    Some((num(&raw[s..i]) as u32, i + 2))
}

fn write_log_line(buf: &mut Vec<u8>, ts: i64, ident: &[u8], level: &str, logger: &[u8], body: &[u8]) {
    buf.extend_from_slice(b"{\"ts\":");
    push_int(buf, ts);
    buf.extend_from_slice(b",\"kind\":\"log\",");
    buf.extend_from_slice(ident);
    buf.extend_from_slice(b",\"level\":\"");
    buf.extend_from_slice(level.as_bytes());
    buf.extend_from_slice(b"\",\"logger\":");
    json_str(buf, logger);
    buf.extend_from_slice(b",\"msg\":");
    json_str(buf, body);
    buf.extend_from_slice(b"}\n");
}

/// A log event written from its dict by `_write`: `{"kind":"log","level":…,"msg":…,"logger":…,"ts":…}`.
fn write_log_dict(buf: &mut Vec<u8>, open: &[u8], ts: i64, level: &str, logger: &[u8], body: &[u8]) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"");
    buf.extend_from_slice(level.as_bytes());
    buf.extend_from_slice(b"\",\"msg\":");
    json_str(buf, body);
    buf.extend_from_slice(b",\"logger\":");
    json_str(buf, logger);
    buf.extend_from_slice(b",\"ts\":");
    push_int(buf, ts);
    buf.extend_from_slice(b"}\n");
}

fn write_pending(buf: &mut Vec<u8>, open: &[u8], p: &Pending, ts: i64) {
    buf.extend_from_slice(open);
    match p {
        Pending::Print { msg } => {
            buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"INFO\",\"msg\":");
            json_str(buf, msg.as_bytes());
        }
        Pending::TqdmSpan { step, dur, id, dt } => {
            buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"step\",\"name\":\"step\",\"step\":");
            push_int(buf, *step);
            buf.extend_from_slice(b",\"dur\":");
            push_int(buf, *dur);
            buf.extend_from_slice(b",\"span_id\":\"");
            buf.extend_from_slice(id.as_bytes());
            buf.extend_from_slice(b"\",\"attrs\":{\"source\":\"tqdm\"},\"start\":");
            push_int(buf, ts + dt - dur);
            buf.extend_from_slice(b",\"ts\":");
            push_int(buf, ts + dt);
            buf.extend_from_slice(b",\"est\":true}\n");
            return;
        }
        Pending::TqdmMetric { n, total } => {
            buf.extend_from_slice(b"\"kind\":\"metric\",\"step\":");
            push_int(buf, *n);
            buf.extend_from_slice(b",\"metrics\":{\"progress\":");
            buf.extend_from_slice(json_float(*n as f64).unwrap_or_default().as_bytes());
            buf.extend_from_slice(b",\"progress_total\":");
            buf.extend_from_slice(json_float(*total as f64).unwrap_or_default().as_bytes());
            buf.push(b'}');
        }
        Pending::DictMetric { metrics, step, estimated } => {
            buf.extend_from_slice(b"\"kind\":\"metric\",\"metrics\":{");
            for (i, (k, v)) in metrics.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                json_str(buf, k.as_bytes());
                buf.push(b':');
                buf.extend_from_slice(json_float(*v).unwrap_or_default().as_bytes());
            }
            buf.push(b'}');
            if *estimated {
                buf.extend_from_slice(b",\"attrs\":{\"step_estimated\":true}");
            }
            if let Some(step) = step {
                buf.extend_from_slice(b",\"step\":");
                push_int(buf, *step);
            }
        }
        Pending::Nccl { level, msg, host, pid, tid, dev, src } => {
            buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"");
            buf.extend_from_slice(level.as_bytes());
            buf.extend_from_slice(b"\",\"logger\":\"nccl\",\"msg\":");
            json_str(buf, msg.as_bytes());
            buf.extend_from_slice(b",\"attrs\":{\"nccl_host\":");
            json_str(buf, host.as_bytes());
            buf.extend_from_slice(b",\"nccl_pid\":");
            push_int(buf, *pid);
            buf.extend_from_slice(b",\"tid\":");
            push_int(buf, *tid);
            buf.extend_from_slice(b",\"cuda_dev\":");
            push_int(buf, *dev);
            if let Some(src) = src {
                buf.extend_from_slice(b",\"src\":");
                json_str(buf, src.as_bytes());
            }
            buf.push(b'}');
        }
    }
    buf.extend_from_slice(b",\"ts\":");
    push_int(buf, ts);
    buf.extend_from_slice(b",\"est\":true}\n");
}

#[pymodule]
fn jobtrace_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FastLane>()?;
    m.add_class::<MomentStore>()?;
    recorder::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
