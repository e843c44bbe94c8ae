//! jobtrace's compiled ingest fast lane.
//!
//! The Python engine (`ingest/_engine.py`) is the reference: it reads every format and
//! keeps every rule. Most lines of a training log are a handful of kinds, though, and
//! Python spends ~10 µs on each of them however it is written (measured: an ingest whose
//! event writer cost nothing ran at the same rate). This module takes those kinds and
//! writes their events byte for byte as the Python engine would, and gives every other
//! line back to Python, one at a time, in order:
//!
//! * a Python `logging` line in the strict form of `ingest/_plain.py` with no parser
//!   trigger in it: one log event;
//! * such a line that only the generic step parser triggers on (`step 12 loss … time …
//!   (forward …ms …)`): its log, metric and span events;
//! * a line with no timestamp and no parser trigger (a `print`), or one that only the
//!   NCCL parser triggers on (`host:pid:tid [dev] NCCL INFO …`): a log event that waits
//!   for the stream's next timestamp, as the Python engine's pending lines do.
//!
//! A line is given back when anything about it is unusual (another layout, a new stream,
//! a stream whose multi-line block or pending lines Python holds, bytes that are not
//! clean UTF-8, a number whose JSON text could differ, a message to truncate…), so the
//! output never depends on which engine read a line: `tests/ingest/test_native.py`
//! compares the two engines' output byte for byte.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

// ---- JSON text, as orjson writes it --------------------------------------------------

/// A JSON string of valid UTF-8 text, escaped as orjson escapes it.
fn json_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut start = 0;
    for (i, &c) in s.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            c if c < 0x20 => {
                out.extend_from_slice(&s[start..i]);
                out.extend_from_slice(format!("\\u{:04x}", c).as_bytes());
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// A float as orjson writes it, where that is certain: shortest round-trip digits in
/// decimal notation, which orjson uses for magnitudes in [1e-5, 1e16); `None` elsewhere.
fn json_float(x: f64) -> Option<String> {
    if x == 0.0 {
        return Some(if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() });
    }
    let a = x.abs();
    if !(1e-5..1e16).contains(&a) {
        return None;
    }
    let mut s = format!("{}", x);
    if !s.contains('.') {
        s.push_str(".0");
    }
    Some(s)
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(v).as_bytes());
}

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

const UNITS: [&str; 8] = ["ms", "s", "us", "µs", "sec", "secs", "seconds", "msec"];

const FRAC_SCALE: [i64; 10] = [0, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1];

// ---- the stream state the fast lane keeps -------------------------------------------

/// A line without a timestamp, waiting (as in the Python engine) for the stream's next one.
enum Pending {
    Print { msg: String },
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
    /// The epoch day of the last strict head read here since Python last saw the stream.
    iso_day: Option<i64>,
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
    estimated: u64,
}

/// The fast lane of one input file: its streams, outputs and counters.
#[pyclass(unsendable)]
struct FastLane {
    srun: bool,
    tz_offset_s: i64,
    cap: usize,
    pending_cap: usize,
    triggers: regex::bytes::RegexSet,
    /// All triggers in one pattern: finds, in one pass over a block, the few lines any parser may want.
    any_trigger: regex::bytes::Regex,
    /// Start offsets of the current block's lines that a trigger matched in, ascending, and a cursor.
    hit_lines: Vec<usize>,
    hit_at: usize,
    trigger_parser: Vec<usize>,
    generic: Option<usize>,
    nccl: Option<usize>,
    streams: Vec<Stream>,
    by_label: HashMap<Option<u32>, usize>,
    outs: Vec<Vec<u8>>,
    /// The generic parser's `_role` by key, then by unit (`UNITS` index; 0: none).
    roles: HashMap<String, [Option<Role>; 9]>,
    role_fn: Py<PyAny>,
    /// The number the next span id is made from: set by Python before `run`, read after it.
    #[pyo3(get, set)]
    next_span_id: u64,
    step_rx: regex::Regex,
    nccl_rx: regex::Regex,
    counts: Counts,
    sync: Vec<(Option<u32>, i64, i64)>,
    /// Parsers whose step lines are clock-alignment moments (`sync_points` with `sync_step`).
    sync_parsers: Vec<usize>,
    /// Alignment pass: the epoch day of the last strict head per label since Python last read a line of it.
    sync_days: HashMap<Option<u32>, i64>,
}

/// Why a line goes back to Python (nothing of it has been written).
struct GiveBack;

type Ids = Vec<usize>;

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
        let set = regex::bytes::RegexSetBuilder::new(&pats)
            .unicode(false)
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let any_src = if pats.is_empty() {
            "[^\\x00-\\xff]".to_string() // matches nothing
        } else {
            pats.iter().map(|p| format!("(?:{p})")).collect::<Vec<_>>().join("|")
        };
        let any = regex::bytes::RegexBuilder::new(&any_src)
            .unicode(false)
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let find = |n: &str| names.iter().position(|x| x == n);
        Ok(FastLane {
            srun,
            tz_offset_s,
            cap,
            pending_cap,
            triggers: set,
            any_trigger: any,
            hit_lines: Vec::new(),
            hit_at: 0,
            trigger_parser: owner,
            generic: find("generic-step"),
            nccl: find("nccl"),
            streams: Vec::new(),
            by_label: HashMap::new(),
            outs: Vec::new(),
            roles: HashMap::new(),
            role_fn: role,
            next_span_id: 1,
            // ASCII classes: the lane gives these patterns printable ASCII only, where they read as Python's.
            step_rx: regex::RegexBuilder::new(r"(?i)\b(global_step|step|iter|iteration)\b\s*[=:#]?\s*\[?(\d+)(?:\s*/\s*\d+)?")
                .unicode(false)
                .build()
                .unwrap(),
            nccl_rx: regex::Regex::new(
                r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] (?:(?P<file>[\w./-]+):(?P<line>\d+) (?:\((?P<func>[^)]*)\) )?)?NCCL (?P<lvl>INFO|WARN|TRACE|CALL|ABORT) ?(?P<msg>.*)",
            )
            .unwrap(),
            counts: Counts::default(),
            sync: Vec::new(),
            sync_parsers,
            sync_days: HashMap::new(),
        })
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
            iso_day: None,
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

    /// Before Python reads a line of the stream: `(last_ts, iso_day, pending events as dicts)`, which the
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
        let day = s.iso_day.take();
        Ok(Some(PyTuple::new(py, [s.last_ts.into_pyobject(py)?.into_any(), day.into_pyobject(py)?.into_any(), pend.into_any()])?))
    }

    /// Read lines of `block` from byte `pos` until one that Python must read, or the end.
    ///
    /// `block` is lines joined by `\n` (an empty block is one empty line). Returns `None`
    /// at the end, else `(start, end, label, ids)` of the line to give back: its `srun`
    /// label (`None` without one) and the indices of the parsers its triggers name.
    fn run(&mut self, py: Python<'_>, block: &[u8], pos: usize) -> Option<(usize, usize, Option<u32>, Ids)> {
        let n = block.len();
        if pos == 0 {
            self.find_hit_lines(block);
        }
        let mut start = pos;
        loop {
            let end = memchr::memchr(b'\n', &block[start..]).map_or(n, |k| start + k);
            let raw = &block[start..end];
            let mut ids = Vec::new();
            while self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] < start {
                self.hit_at += 1;
            }
            let hit = self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] == start;
            match self.line(py, raw, hit, &mut ids) {
                Ok(true) => {}
                Ok(false) | Err(GiveBack) => return Some((start, end, self.label_of(raw), ids)),
            }
            self.counts.lines += 1;
            self.counts.parsed += 1;
            if end >= n {
                return None;
            }
            start = end + 1;
        }
    }

    /// The clock-alignment pass (`Ingestor._sync_block`): the moments of `block` from byte `pos`, until a
    /// line that Python must read.
    ///
    /// Returns `(points, stop)`: points `(label, step, ts)` in line order, and `None` at the end or the line
    /// to give back as `(start, end, label, sync parser ids, day)`, where `day` is the epoch day of the last
    /// strict head of that label read here since the previous such line (to note in Python's head parser).
    #[allow(clippy::type_complexity)]
    fn sync_run(
        &mut self,
        block: &[u8],
        pos: usize,
    ) -> (Vec<(Option<u32>, i64, i64)>, Option<(usize, usize, Option<u32>, Ids, Option<i64>)>) {
        let n = block.len();
        if pos == 0 {
            self.find_hit_lines(block);
        }
        let mut points = Vec::new();
        let mut start = pos;
        loop {
            let end = memchr::memchr(b'\n', &block[start..]).map_or(n, |k| start + k);
            while self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] < start {
                self.hit_at += 1;
            }
            if self.hit_at < self.hit_lines.len() && self.hit_lines[self.hit_at] == start {
                let raw = &block[start..end];
                let mut ids: Ids = Vec::new();
                for k in self.triggers.matches(raw).iter() {
                    let p = self.trigger_parser[k];
                    if self.sync_parsers.contains(&p) && !ids.contains(&p) {
                        ids.push(p);
                    }
                }
                ids.sort_unstable();
                if !ids.is_empty() {
                    match self.sync_line(raw, &ids) {
                        Ok(Some((label, step, ts))) => points.push((label, step, ts)),
                        Ok(None) => {}
                        Err(GiveBack) => {
                            let label = self.label_of(raw);
                            let day = self.sync_days.remove(&label);
                            return (points, Some((start, end, label, ids, day)));
                        }
                    }
                }
            }
            if end >= n {
                return (points, None);
            }
            start = end + 1;
        }
    }

    /// What was written since the last call: `(outputs, counts, sync points)`.
    ///
    /// Outputs are `(out, bytes)` in the order their streams were added; counts a dict of
    /// the summary's numbers; sync points `(label, step, ts)` of step ends.
    #[allow(clippy::type_complexity)]
    fn drain<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Vec<(usize, Bound<'py, PyBytes>)>, Bound<'py, PyDict>, Vec<(Option<u32>, i64, i64)>)> {
        let mut outs = Vec::new();
        for (i, buf) in self.outs.iter_mut().enumerate() {
            if !buf.is_empty() {
                outs.push((i, PyBytes::new(py, buf)));
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
        d.set_item("estimated", c.estimated)?;
        Ok((outs, d, std::mem::take(&mut self.sync)))
    }
}

impl FastLane {
    /// The lines of `block` in which a trigger matches (a few in a hundred, in a real log).
    fn find_hit_lines(&mut self, block: &[u8]) {
        self.hit_lines.clear();
        self.hit_at = 0;
        let mut last_line = usize::MAX;
        for m in self.any_trigger.find_iter(block) {
            // the line holding the match's last byte (a match never ends on a newline it did not cross)
            let at = m.end().saturating_sub(1).max(m.start());
            let line = memchr::memrchr(b'\n', &block[..at]).map_or(0, |k| k + 1);
            if line != last_line {
                self.hit_lines.push(line);
                last_line = line;
            }
        }
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
            // Which parsers, on the whole line, as the Python engine's chunk scan sees them.
            for k in self.triggers.matches(raw).iter() {
                let p = self.trigger_parser[k];
                if !ids.contains(&p) {
                    ids.push(p);
                }
            }
            ids.sort_unstable();
        }
        if raw.contains(&0) || std::str::from_utf8(raw).is_err() {
            return Err(GiveBack);
        }
        let (label, text) = if self.srun {
            match srun_label(raw) {
                Some((r, at)) => (Some(r), &raw[at..]),
                None => (None, raw),
            }
        } else {
            (None, raw)
        };
        let Some(&si) = self.by_label.get(&label) else { return Err(GiveBack) };
        // A blank text, one that starts with white space, or a torchrun prefix or bracketed head: Python's.
        if self.streams[si].busy || text.is_empty() || !(0x21..=0x7e).contains(&text[0]) || text[0] == b'[' {
            return Err(GiveBack);
        }
        if let Some(h) = strict_head(text) {
            if self.streams[si].out.is_none() {
                return Err(GiveBack);
            }
            let ts = self.stamp(&h).ok_or(GiveBack)?;
            let body = &text[h.body_at..];
            return match ids.as_slice() {
                [] => self.plain(si, ts, &h, body),
                [g] if Some(*g) == self.generic => self.step_line(py, si, label, ts, &h, body),
                _ => Err(GiveBack),
            };
        }
        if may_have_head(text[0]) {
            return Err(GiveBack);
        }
        match ids.as_slice() {
            [] => self.print_line(si, text),
            [p] if Some(*p) == self.nccl => self.nccl_line(si, text),
            _ => Err(GiveBack),
        }
    }

    fn stamp(&self, h: &Head<'_>) -> Option<(i64, i64)> {
        let (day, sod) = day_and_second(h.date, h.tod)?;
        let base = (day * 86400 + sod - self.tz_offset_s) * 1_000_000_000;
        Some((base + num(h.frac) * FRAC_SCALE[h.frac.len()], day))
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
        self.counts.logs += n as u64;
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
        let c = self.nccl_rx.captures(t).ok_or(GiveBack)?;
        let msg = c.name("msg").map_or("", |m| m.as_str());
        if msg.len() > self.cap {
            return Err(GiveBack);
        }
        let int = |k: &str| c.name(k).and_then(|m| m.as_str().parse::<i64>().ok()).ok_or(GiveBack);
        let (pid, tid, dev) = (int("pid")?, int("tid")?, int("dev")?);
        let level = match c.name("lvl").map(|m| m.as_str()) {
            Some("WARN") | Some("ABORT") => "WARNING",
            Some("TRACE") | Some("CALL") => "DEBUG",
            _ => "INFO",
        };
        let src = c.name("file").map(|f| format!("{}:{}", f.as_str(), c.name("line").map_or("", |l| l.as_str())));
        let p = Pending::Nccl {
            level,
            msg: msg.to_string(),
            host: c["host"].to_string(),
            pid,
            tid,
            dev,
            src,
        };
        self.counts.nccl += 1;
        match self.push_pending(si, p) {
            Ok(v) => Ok(v),
            Err(g) => {
                self.counts.nccl -= 1;
                Err(g)
            }
        }
    }

    /// A moment of the alignment pass: a strict-head line whose only sync parser is the generic one,
    /// read as `GenericStepParser.sync_step` reads it; `Ok(None)`: not a moment.
    fn sync_line(&mut self, raw: &[u8], ids: &[usize]) -> Result<Option<(Option<u32>, i64, i64)>, GiveBack> {
        if ids != [self.generic.ok_or(GiveBack)?] || raw.contains(&0) {
            return Err(GiveBack);
        }
        let (label, text) = if self.srun {
            match srun_label(raw) {
                Some((r, at)) => (Some(r), &raw[at..]),
                None => (None, raw),
            }
        } else {
            (None, raw)
        };
        let h = strict_head(text).ok_or(GiveBack)?;
        let (ts, day) = self.stamp(&h).ok_or(GiveBack)?;
        let body = &text[h.body_at..];
        if !body.iter().all(|&c| (0x20..0x7f).contains(&c) || c == b'\t') {
            return Err(GiveBack);
        }
        let text = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        self.sync_days.insert(label, day);
        let Some(m) = self.step_rx.captures(text) else { return Ok(None) };
        let step: i64 = m[2].parse().map_err(|_| GiveBack)?;
        Ok(next_pair(text, m.get(0).unwrap().end())?.map(|_| (label, step, ts)))
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
            s.iso_day = Some(day);
            let (offset, out) = (s.offset, s.out.expect("checked in line()"));
            let open = std::mem::take(&mut s.open);
            let buf = self.out_buf(out);
            write_log_dict(buf, &open, ts + offset, h.level, h.logger, body);
            self.streams[si].open = open;
        } else {
            let s = &mut self.streams[si];
            s.last_ts = Some(ts);
            s.iso_day = Some(day);
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
        let m = self.step_rx.captures(text).ok_or(GiveBack)?;
        let step: i64 = m[2].parse().map_err(|_| GiveBack)?;
        let after = m.get(0).unwrap().end();
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
                    if !(value == value && value.abs() < 1e12) || value * scale <= -1.0 =>
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
        self.release(si, ts);
        let s = &mut self.streams[si];
        s.last_ts = Some(s.last_ts.map_or(ts, |l| l.max(ts)));
        s.iso_day = Some(day);
        let (offset, out) = (s.offset, s.out.expect("checked in line()"));
        let open = std::mem::take(&mut s.open);
        let buf = self.out_buf(out);
        let t = ts + offset;
        write_log_dict(buf, &open, t, h.level, h.logger, body); // the line itself, as `_parse` adds it
        let mut spans = 0u64;
        if !metrics.is_empty() {
            buf.extend_from_slice(&open);
            buf.extend_from_slice(b"\"kind\":\"metric\",\"step\":");
            push_int(buf, step);
            buf.extend_from_slice(b",\"metrics\":{");
            for (i, (k, v)) in metrics.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                json_str(buf, k.as_bytes());
                buf.push(b':');
                buf.extend_from_slice(v.as_bytes());
            }
            buf.extend_from_slice(b"},\"ts\":");
            push_int(buf, t);
            buf.extend_from_slice(b"}\n");
        }
        if step_ns > 0 {
            let parent = &ids[0];
            buf.extend_from_slice(&open);
            buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"step\",\"name\":\"step\",\"step\":");
            push_int(buf, step);
            buf.extend_from_slice(b",\"dur\":");
            push_int(buf, step_ns);
            buf.extend_from_slice(b",\"span_id\":\"");
            buf.extend_from_slice(parent.as_bytes());
            buf.extend_from_slice(b"\",\"attrs\":{\"source\":\"log\"},\"start\":");
            push_int(buf, ts - step_ns + offset);
            buf.extend_from_slice(b",\"ts\":");
            push_int(buf, t);
            buf.extend_from_slice(b"}\n");
            spans += 1;
            let total: i64 = phases.iter().filter(|p| p.2 > 0).map(|p| p.2).sum();
            let mut rel = -total;
            let mut k = 1;
            for (name, coll, dur) in phases.iter().filter(|p| p.2 > 0) {
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
                k += 1;
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
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
