//! The ingest fast lane (`FastLane`): the common lines of a training log, read and written here.
//!
//! The Python engine (`ingest/_engine.py`) is the reference: it reads every format and
//! keeps every rule. Most lines of a training log are a handful of kinds, though, and
//! Python spends ~10 µs on each of them however it is written (measured: an ingest whose
//! event writer cost nothing ran at the same rate). This module takes those kinds and
//! writes their events byte for byte as the Python engine would, and gives every other
//! line back to Python, one at a time, in order, with its stream's state:
//!
//! * a Python `logging` line in the strict form of `ingest/_plain.py` with no parser
//!   trigger in it: one log event (`python_logging`);
//! * such a line that only the generic step parser triggers on (`step 12 loss … time …
//!   (forward …ms …)`): its log, metric and span events (`generic_step`);
//! * DeepSpeed's progress and timer lines (`[date] [INFO] [logging.py:…] [Rank 0] step=…`,
//!   `… time (ms) | fwd: …`; `deepspeed`), Megatron-LM's iteration lines (` [date] iteration N/ T | …`;
//!   `megatron`);
//! * lines with no timestamp that wait for the stream's next one, as the Python engine's
//!   pending lines do (`pending`): a `print` (no trigger), an NCCL INFO/WARN line (`nccl`), a tqdm
//!   refresh, a Hugging Face Trainer metric dict (`{'loss': 2.3456, 'learning_rate': 4.5e-05, …}`;
//!   `huggingface`);
//! * in the clock-alignment pass, the moments of generic step, DeepSpeed and Megatron lines,
//!   kept here (`moments::MomentStore`, `SyncMoments`' rules) rather than handed over one by one.
//!
//! Trigger lines are found by the literals every trigger needs (`crate::literals`: derived from the
//! triggers' syntax, searched for all at once), then checked against just the triggers whose
//! literals they hold (`triggers`). `launcher` reads the `srun` labels that lines may start with,
//! `timestamps` the dates and times of the heads, `stream` and `dicts` the state the lane shares
//! with Python's side of a stream; every event line is written by `crate::line_writer`.
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

use crate::line_writer::{dict_open, lane_writes};
use crate::moments::MomentStore;

mod deepspeed;
mod dicts;
mod generic_step;
mod huggingface;
mod launcher;
mod megatron;
mod nccl;
mod pending;
mod python_logging;
mod stream;
mod timestamps;
mod triggers;

use generic_step::Role;
use pending::Pending;
use python_logging::strict_head;
use stream::{layout_code, Stream};
use timestamps::may_have_head;
use triggers::Compiled;

/// `end` (at most the block's length) after checking `start <= pos <= end`.
fn check_region(block: &[u8], start: usize, pos: usize, end: usize) -> PyResult<usize> {
    if !(start <= pos && pos <= end && end <= block.len()) {
        return Err(PyValueError::new_err(format!("bad region {start}..{end} (at {pos}) of {} bytes", block.len())));
    }
    Ok(end)
}

/// Printable ASCII only (where Python's and Rust's character classes agree).
fn printable(b: &[u8]) -> bool {
    b.iter().all(|&c| (0x20..0x7f).contains(&c))
}

/// The summary's numbers since the last drain (`drain` hands them to Python).
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

/// The fast lane of one input file: its streams, outputs and counters.
#[pyclass(unsendable)]
pub(crate) struct FastLane {
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
    sync: Vec<Moment>,
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

/// Parsers by their number in the registry, ascending.
type Ids = Vec<usize>;

/// A line that a family's reader takes: its stream (index), `srun` label, text after the label, and the
/// parsers its triggers name.
#[derive(Clone, Copy)]
struct LineAt<'a> {
    si: usize,
    label: Option<u32>,
    text: &'a [u8],
    ids: &'a [usize],
}

/// A clock-alignment moment: the line's `srun` label, its step and its time (UTC ns).
type Moment = (Option<u32>, i64, i64);

/// A line to give back: its start and end in the block, `srun` label, and the parsers its triggers name.
type GivenBack = (usize, usize, Option<u32>, Ids);

/// A stream's state as Python hands it to the lane (`ingest._lane.LaneStream`), read by field name: its
/// `srun` label, its output (`None` while Python has made none), clock offset, encoded identity, last time,
/// whether Python holds a multi-line block or pending lines of it, a neighbour's time, the parsers' state
/// dicts, the last head layout read, and whether its rank is a guess.
#[derive(FromPyObject)]
pub struct LaneStream {
    label: Option<u32>,
    out: Option<usize>,
    offset: i64,
    ident: Py<PyBytes>,
    last_ts: Option<i64>,
    busy: bool,
    fallback_ts: Option<i64>,
    generic_state: Py<PyDict>,
    deepspeed_state: Py<PyDict>,
    megatron_state: Py<PyDict>,
    huggingface_state: Py<PyDict>,
    last_layout: Option<String>,
    rank_guessed: bool,
}

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
        let compiled = Compiled::new(&triggers, &names, sync_parsers)?;
        Ok(FastLane::assemble(srun, tz_offset_s, cap, pending_cap, Rc::new(compiled), role))
    }

    /// A lane for another file of the same ingest: this one's settings and compiled triggers, none of its state.
    fn fresh(&self, py: Python<'_>) -> FastLane {
        FastLane::assemble(self.srun, self.tz_offset_s, self.cap, self.pending_cap, self.c.clone(),
                           self.role_fn.clone_ref(py))
    }

    /// Take over (again) the stream of an `srun` label (`None`: lines without one), after Python read a line of
    /// it, with Python's state of it (a [`LaneStream`]). The lane then holds nothing of the stream (Python has
    /// its state).
    fn add_stream(&mut self, py: Python<'_>, stream: LaneStream) {
        let LaneStream {
            label, out, offset, ident, last_ts, busy, fallback_ts, generic_state, deepspeed_state, megatron_state,
            huggingface_state, last_layout, rank_guessed,
        } = stream;
        let ident = ident.as_bytes(py);
        let s = Stream {
            out,
            offset,
            open: dict_open(ident),
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
            fallback_ts,
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
            pend.append((p.into_dict(py)?, 0))?;
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

    /// Whether the lane holds lines it has not written (some wait for a time): an ingest may record how far
    /// it has read a file as written only when neither side holds any.
    fn holding(&self) -> bool {
        self.streams.iter().any(|s| !s.pending.is_empty())
    }

    /// At the end of the file: write the lines still waiting for a time at the stream's last time (or the
    /// neighbour's), as `_release_pending(final=True)` does; streams without an output keep theirs (Python's).
    fn release_all(&mut self) {
        for si in 0..self.streams.len() {
            let s = &self.streams[si];
            if s.pending.is_empty() || s.out.is_none() {
                continue;
            }
            if let Some(lo) = s.last_ts.or(s.fallback_ts) {
                let last = self.write_released(si, lo, lo);
                self.streams[si].last_ts = Some(last);
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
            match Pending::from_dict(&ev) {
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
    /// A lane of the given settings and compiled triggers, holding no stream yet.
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

    /// The buffer of output `out` (Python's index), made where it is new.
    fn out_buf(&mut self, out: usize) -> &mut Vec<u8> {
        if self.outs.len() <= out {
            self.outs.resize_with(out + 1, Vec::new);
        }
        &mut self.outs[out]
    }

    /// Read one line; `Ok(true)`: written (or pending), `Ok(false)`/`Err`: Python's. Which family's reader
    /// takes it is decided here, by how its text starts and which triggers it holds.
    fn line(&mut self, py: Python<'_>, raw: &[u8], hit: bool, ids: &mut Ids) -> Result<bool, GiveBack> {
        if hit {
            self.trigger_ids(raw, false, ids);
        }
        let (label, text) = self.split_label(raw)?;
        let Some(&si) = self.by_label.get(&label) else { return Err(GiveBack) };
        if self.streams[si].busy || text.is_empty() || Self::mpirun_tagged(text) {
            return Err(GiveBack);
        }
        let l = LineAt { si, label, text, ids: ids.as_slice() };
        if text.starts_with(b" [") {
            return self.megatron_line(py, l); // Megatron's " [date time] iteration …"
        }
        if text[0] == b' ' && ids.len() == 1 && Some(ids[0]) == self.c.huggingface {
            return self.tqdm_line(py, l); // no head layout starts with a blank not followed by "["
        }
        // A blank text, or one that starts with white space: Python's.
        if !(0x21..=0x7e).contains(&text[0]) {
            return Err(GiveBack);
        }
        if text[0] == b'[' {
            return self.deepspeed_line(py, l); // else a torchrun prefix or another bracketed head
        }
        if let Some(h) = strict_head(text) {
            if self.streams[si].out.is_none() {
                return Err(GiveBack);
            }
            let stamp = self.stamp(&h).ok_or(GiveBack)?;
            return match ids.as_slice() {
                [] => self.plain(si, stamp, &h, &text[h.body_at..]),
                [g] if Some(*g) == self.c.generic => self.step_line(py, l, stamp, &h),
                _ => Err(GiveBack),
            };
        }
        if may_have_head(text[0]) {
            return Err(GiveBack);
        }
        match ids.as_slice() {
            [] => self.print_line(si, text),
            [p] if Some(*p) == self.c.nccl => self.nccl_line(si, text),
            [p, ..] if Some(*p) == self.c.huggingface && text[0] == b'{' => self.hf_dict_line(py, l),
            _ => Err(GiveBack),
        }
    }

    /// A moment of the alignment pass (`sync_step` of the line's first sync parser), read by the parser's
    /// module; `Ok(None)`: not a moment.
    fn sync_line(&mut self, raw: &[u8], ids: &[usize]) -> Result<Option<Moment>, GiveBack> {
        let (label, text) = self.split_label(raw)?;
        if Self::mpirun_tagged(text) {
            return Err(GiveBack);
        }
        if ids.first().is_some_and(|&i| Some(i) == self.c.megatron) && text.starts_with(b" [") {
            return self.megatron_moment(label, text);
        }
        if ids.first().is_some_and(|&i| Some(i) == self.c.deepspeed) && text.first() == Some(&b'[') {
            return self.deepspeed_moment(label, text, ids);
        }
        if ids != [self.c.generic.ok_or(GiveBack)?] {
            return Err(GiveBack);
        }
        self.generic_moment(label, text)
    }

    /// A span id as `new_span_id()` of the parsers makes it.
    fn new_span_id(&mut self) -> String {
        let n = self.next_span_id;
        self.next_span_id += 1;
        format!("{:016x}", (0x6a74u64 << 48) | n)
    }
}

/// A metric value of a line, where the lane writes it as `metric_value` and orjson do
/// (`line_writer::lane_writes`); any other makes the line Python's.
fn metric_value(v: f64) -> Result<f64, GiveBack> {
    if lane_writes(v) {
        Ok(v)
    } else {
        Err(GiveBack)
    }
}
