//! The training thread's recorder, compiled: spans, collectives, metric points and log
//! records kept as small structs at the call and written as event lines by the drain.
//!
//! `otel_instrumentation/_recorder.py` is the reference. In a training step each of its
//! calls runs once, on caches the model's kernels have just evicted, where every line of
//! Python costs about a microsecond; the demo's step paid ~50 µs on the training thread
//! and ~25–37 µs on the export thread for its eight events (`benchmarks/demo_calls.py`).
//! Here a span's enter and exit are one C call each that push and pop a frame and queue a
//! struct; the export thread's drain writes every queued event in one tight loop (warm
//! caches, the GIL released), which costs a fraction of writing each line at its call.
//!
//! What is not common is handed to Python, never dropped: a log record whose arguments
//! could change (formatted by Python first), one with an exception, a metric value that
//! is not a number or a CPU tensor, attributes that need `orjson`, text that is not valid
//! UTF-8. Such events stay in the queue in order, and the drain encodes them with the
//! Python encoder, so a line never depends on which recorder wrote it
//! (`tests/otel_instrumentation/test_native_recorder.py` compares the two byte for byte).
//!
//! Locking: every method borrows the recorder only while it runs Rust code. Python code
//! (a hook, an `orjson` call, even an allocation that may start the garbage collector)
//! can switch threads, and the heartbeat and export threads borrow the recorder too, so
//! such calls happen before or after a borrow, never inside one.

use std::fs::File;
use std::mem::take;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustc_hash::FxHashMap as HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::json::{decimal_float, json_str, push_float, push_hex16, push_int};

// Item tags of `_recorder.py`.
const SPAN: i64 = 0;
const LOG: i64 = 1;
const METRIC: i64 = 2;

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn thread_ident() -> u64 {
    // SAFETY: a plain read of the calling thread's id; the same value as threading.get_ident().
    unsafe { pyo3::ffi::PyThread_get_thread_ident() as u64 }
}

/// A process-unique seed: std's hasher keys come from the OS's random source.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(now_ns());
    h.write_u32(std::process::id());
    h.finish()
}

/// An exact `int` that fits, as Python's fast path takes it (`type(x) is int`).
fn exact_i64(v: &Bound<'_, PyAny>) -> Option<i64> {
    if v.is_exact_instance_of::<PyInt>() {
        v.extract().ok()
    } else {
        None
    }
}

fn exact_u64(v: &Bound<'_, PyAny>) -> Option<u64> {
    if v.is_exact_instance_of::<PyInt>() {
        v.extract().ok()
    } else {
        None
    }
}

/// `None` → `Some(None)`; an exact int → `Some(Some(i))`; anything else → `None` (Python's path).
fn opt_i64(v: &Bound<'_, PyAny>) -> Option<Option<i64>> {
    if v.is_none() {
        Some(None)
    } else {
        exact_i64(v).map(Some)
    }
}

fn opt_u64(v: &Bound<'_, PyAny>) -> Option<Option<u64>> {
    if v.is_none() {
        Some(None)
    } else {
        exact_u64(v).map(Some)
    }
}

/// `v` where Python would take it as given (`if v:`), None where it is None or empty.
fn given(v: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    Ok(if v.is_none() || !v.is_truthy()? { None } else { Some(v.clone().unbind()) })
}

/// Valid UTF-8 text of an exact `str`, JSON-encoded; `None` for anything else (Python's path).
fn json_of(v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let s = v.cast_exact::<PyString>().ok()?.to_str().ok()?;
    let mut out = Vec::with_capacity(s.len() + 2);
    json_str(&mut out, s.as_bytes());
    Some(out)
}

/// How the installed orjson writes an exponent: 0 unknown (such floats go to Python), 1 `1e16`, 2 `1e+16`.
static SCI_STYLE: AtomicU8 = AtomicU8::new(0);

fn sci_plus() -> Option<bool> {
    match SCI_STYLE.load(Ordering::Relaxed) {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}

/// A JSON chunk shared by every event that repeats it (a span's name and category, a metric's key).
type Chunk = Arc<[u8]>;

#[derive(Clone, Copy)]
enum Num {
    F(f64),
    I(i64),
}

/// A metric value as `_recorder._number` reads it, when it is a plain number the drain can write.
fn number(v: &Bound<'_, PyAny>) -> Option<Num> {
    if v.is_exact_instance_of::<PyFloat>() {
        let x: f64 = v.extract().ok()?;
        // Checked without writing it: this runs at the call, on the training thread.
        if x.is_finite() && !decimal_float(x) && sci_plus().is_none() {
            return None; // written by orjson, whose notation for it is not known here
        }
        Some(Num::F(x))
    } else if v.is_exact_instance_of::<PyBool>() {
        Some(Num::I(v.is_truthy().ok()? as i64))
    } else {
        exact_i64(v).map(Num::I)
    }
}

fn push_num(out: &mut Vec<u8>, n: Num) {
    match n {
        Num::I(i) => push_int(out, i),
        Num::F(x) if x.is_nan() => out.extend_from_slice(b"\"NaN\""),
        Num::F(x) if x.is_infinite() => out.extend_from_slice(if x > 0.0 { b"\"Infinity\"" } else { b"\"-Infinity\"" }),
        Num::F(x) => {
            push_float(out, x, sci_plus());
        }
    }
}

/// A queued event. Spans, collectives and metric points are written by the drain without Python;
/// `Log` (formatted with Python's `%` first) and `Item` (the Python encoder's) need the GIL.
enum Ev {
    Span {
        sid: u64,
        parent: Option<u64>,
        named: Chunk,
        start: i64,
        end: i64,
        step: Option<i64>,
        attrs: Option<Box<[u8]>>,
    },
    Coll {
        sid: u64,
        parent: Option<u64>,
        op: Chunk,
        group: Chunk,
        size: i64,
        seq: i64,
        bytes: i64,
        start: i64,
        end: i64,
        step: Option<i64>,
        is_async: bool,
        error: Option<Box<[u8]>>,
    },
    /// Its values are `mvals[from..to]`.
    Metric { ts: i64, sid: Option<u64>, step: Option<i64>, from: u32, to: u32 },
    Log {
        created: f64,
        level: Py<PyAny>,
        logger: Py<PyAny>,
        msg: Py<PyAny>,
        args: Option<Py<PyAny>>,
        exc: Option<Py<PyAny>>,
        sid: Option<u64>,
        step: Option<i64>,
    },
    Item(Py<PyAny>),
}

fn head(out: &mut Vec<u8>, base: &[u8], ts: i64, kind: &[u8]) {
    out.extend_from_slice(b"{\"ts\":");
    push_int(out, ts);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(kind);
    out.extend_from_slice(b"\",");
    out.extend_from_slice(base);
}

fn push_id(out: &mut Vec<u8>, key: &[u8], id: Option<u64>) {
    if let Some(v) = id {
        out.extend_from_slice(key);
        push_hex16(out, v);
        out.push(b'"');
    }
}

fn push_step(out: &mut Vec<u8>, step: Option<i64>) {
    if let Some(s) = step {
        out.extend_from_slice(b",\"step\":");
        push_int(out, s);
    }
}

/// A span line up to its attributes: identity, ids, `named` (`,"name":…,"cat":…` in parts), times, step.
#[allow(clippy::too_many_arguments)]
fn span_head(out: &mut Vec<u8>, base: &[u8], sid: u64, parent: Option<u64>, named: &[&[u8]], start: i64, end: i64, step: Option<i64>) {
    head(out, base, end, b"span");
    push_id(out, b",\"span_id\":\"", Some(sid));
    push_id(out, b",\"parent_id\":\"", parent);
    for part in named {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b",\"start\":");
    push_int(out, start);
    out.extend_from_slice(b",\"dur\":");
    push_int(out, end - start);
    push_step(out, step);
}

/// The line of a span, a collective or a metric point, as the Python encoder writes it
/// (`_encode_span`, `_as_span`, `_encode_metric`); false for the events Python writes.
fn encode(out: &mut Vec<u8>, base: &[u8], ev: &Ev, mvals: &[(Chunk, Num)]) -> bool {
    match ev {
        Ev::Span { sid, parent, named, start, end, step, attrs } => {
            span_head(out, base, *sid, *parent, &[named], *start, *end, *step);
            if let Some(a) = attrs {
                out.extend_from_slice(b",\"attrs\":");
                out.extend_from_slice(a);
            }
        }
        Ev::Coll { sid, parent, op, group, size, seq, bytes, start, end, step, is_async, error } => {
            span_head(out, base, *sid, *parent, &[b",\"name\":", op, b",\"cat\":\"collective\""], *start, *end, *step);
            out.extend_from_slice(b",\"attrs\":{\"op\":");
            out.extend_from_slice(op);
            out.extend_from_slice(b",\"group\":");
            out.extend_from_slice(group);
            out.extend_from_slice(b",\"group_size\":");
            push_int(out, *size);
            out.extend_from_slice(b",\"seq\":");
            push_int(out, *seq);
            out.extend_from_slice(b",\"bytes\":");
            push_int(out, *bytes);
            if *is_async {
                out.extend_from_slice(b",\"async\":true");
            }
            if let Some(e) = error {
                out.extend_from_slice(b",\"error\":");
                out.extend_from_slice(e);
            }
            out.push(b'}');
        }
        Ev::Metric { ts, sid, step, from, to } => {
            head(out, base, *ts, b"metric");
            push_id(out, b",\"span_id\":\"", *sid);
            out.extend_from_slice(b",\"metrics\":{");
            for (i, (k, v)) in mvals[*from as usize..*to as usize].iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(k);
                out.push(b':');
                push_num(out, *v);
            }
            out.push(b'}');
            push_step(out, *step);
        }
        Ev::Log { .. } | Ev::Item(_) => return false,
    }
    out.extend_from_slice(b"}\n");
    true
}

/// What an event's queueing asks of its caller once the recorder is no longer borrowed.
#[derive(PartialEq)]
enum Signal {
    None,
    /// A batch is waiting: wake the export thread (once per batch).
    Wake,
    /// The queue is full (the sinks cannot keep up): write it to the spill file now.
    Spill,
}

struct Frame {
    span: Py<Span>,
    id: u64,
    parent: Option<u64>,
    start: i64,
    step: Option<i64>,
}

struct Group {
    name: Py<PyAny>,
    /// None: a name that is not valid text (such collectives are written by the Python encoder).
    name_json: Option<Chunk>,
    size: i64,
    seq: i64,
}

struct InCollective {
    op: Py<PyString>,
    group: Py<PyAny>,
    seq: i64,
    t0: i64,
    bytes: i64,
}

/// Host RSS at step ends, at most once per interval (`_torch.memory_hook`'s rule, without its Python call).
struct Rss {
    statm: File,
    interval_ns: i64,
    next_ns: i64,
    page: i64,
}

impl Rss {
    fn open(interval_ns: i64, page: i64) -> Option<Rss> {
        let statm = File::open("/proc/self/statm").ok()?;
        Some(Rss { statm, interval_ns, next_ns: 0, page })
    }

    fn read(&self) -> Option<i64> {
        let mut buf = [0u8; 128];
        let n = self.statm.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let pages: i64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
        Some(pages * self.page)
    }
}

/// The queue's and the drain's buffers, kept from one drain to the next: new ones the size of a
/// busy second (megabytes at thousands of events a second) cost page faults each time, the queue's
/// on the training thread that fills it.
#[derive(Default)]
struct Buffers {
    evs: Vec<Ev>,
    mvals: Vec<(Chunk, Num)>,
    out: Vec<u8>,
    full: Vec<u8>,
}

impl Buffers {
    /// Emptied, keeping their room up to what a busy second needs (a spilled queue's is let go).
    fn recycle(mut self) -> Buffers {
        fn empty<T>(v: &mut Vec<T>, keep_at_most: usize) {
            v.clear();
            if v.capacity() > keep_at_most {
                *v = Vec::new();
            }
        }
        empty(&mut self.evs, 1 << 16);
        empty(&mut self.mvals, 1 << 16);
        empty(&mut self.out, 1 << 24);
        empty(&mut self.full, 1 << 24);
        self
    }
}

/// The hot path of one process's tracing; `otel_instrumentation._native.NativeRecorder` wraps it.
#[pyclass(module = "jobtrace_native")]
pub struct Recorder {
    base: Arc<[u8]>,
    /// The current training step, as the step span set it.
    #[pyo3(get, set)]
    step: Option<i64>,
    #[pyo3(get, set)]
    last_progress_ns: i64,
    /// The parent of top-level spans (the job's root span).
    #[pyo3(get, set)]
    root_span_id: Option<u64>,
    main_ident: u64,
    main: Vec<Frame>,
    others: HashMap<u64, Vec<Frame>>,
    ids: u64,
    evs: Vec<Ev>,
    mvals: Vec<(Chunk, Num)>,
    woken: bool,
    batch: usize,
    max_events: usize,
    in_coll: Option<InCollective>,
    groups: HashMap<usize, Group>,
    /// Shared span objects (no step, no attributes) by (name, cat) object; they keep both alive.
    spans: HashMap<(usize, usize), Py<Span>>,
    /// `,"name":…,"cat":…` by (name, cat) object, for spans made anew each time (step spans).
    names: HashMap<(usize, usize), (Py<PyAny>, Py<PyAny>, Chunk)>,
    /// A metric key's JSON by key object (kept alive here, so its address is not reused).
    keys: HashMap<usize, (Py<PyAny>, Chunk)>,
    /// Level and logger names' JSON, used by the drain (export thread).
    strings: HashMap<String, Vec<u8>>,
    rss: Option<Rss>,
    rss_key: Chunk,
    hooks: Py<PyList>,
    slow_log: Py<PyAny>,
    slow_metrics: Py<PyAny>,
    encode_one: Py<PyAny>,
    encode_attrs: Py<PyAny>,
    wake: Option<Py<PyAny>>,
    spill: Option<Py<PyAny>>,
    /// Set at shutdown: what the entry points return from then on (the null span).
    retired: Option<Py<PyAny>>,
    spare: Buffers,
}

const CACHE_MAX: usize = 4096;

impl Recorder {
    fn next_id(&mut self) -> u64 {
        // SplitMix64: span ids need to be unique, not secret; never 0 (Python's `getrandbits(64) or 1`).
        loop {
            self.ids = self.ids.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.ids;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }

    fn stack(&mut self) -> &mut Vec<Frame> {
        let t = thread_ident();
        if t == self.main_ident {
            &mut self.main
        } else {
            self.others.entry(t).or_default()
        }
    }

    fn stack_ref(&self) -> Option<&Vec<Frame>> {
        let t = thread_ident();
        if t == self.main_ident {
            Some(&self.main)
        } else {
            self.others.get(&t)
        }
    }

    fn top_id(&self) -> Option<u64> {
        self.stack_ref().and_then(|s| s.last()).map(|f| f.id).or(self.root_span_id)
    }

    fn push(&mut self, ev: Ev) -> Signal {
        self.evs.push(ev);
        let n = self.evs.len();
        if n >= self.max_events {
            Signal::Spill
        } else if n >= self.batch && !self.woken {
            self.woken = true;
            Signal::Wake
        } else {
            Signal::None
        }
    }

    fn push_metric(&mut self, ts: i64, sid: Option<u64>, step: Option<i64>, values: impl Iterator<Item = (Chunk, Num)>) -> Signal {
        let from = self.mvals.len() as u32;
        self.mvals.extend(values);
        let to = self.mvals.len() as u32;
        self.push(Ev::Metric { ts, sid, step, from, to })
    }
}

/// `,"name":…,"cat":…` of a span; None when either is not valid text.
fn named_of(name: &Bound<'_, PyAny>, cat: &Bound<'_, PyAny>) -> Option<Chunk> {
    let (n, c) = (json_of(name)?, json_of(cat)?);
    let mut v = Vec::with_capacity(n.len() + c.len() + 16);
    v.extend_from_slice(b",\"name\":");
    v.extend_from_slice(&n);
    v.extend_from_slice(b",\"cat\":");
    v.extend_from_slice(&c);
    Some(v.into())
}

/// A span for the package's entry points, or the null span once the recorder is retired.
fn entry_span(
    rec: &Bound<'_, Recorder>,
    name: &Bound<'_, PyAny>,
    cat: &Bound<'_, PyString>,
    step: Option<&Bound<'_, PyAny>>,
    attrs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    if let Some(null) = &rec.try_borrow()?.retired {
        return Ok(null.clone_ref(rec.py()));
    }
    Ok(Recorder::span(rec, name, cat.as_any(), step, attrs.map(|a| a.as_any()))?.into_any())
}

/// After queueing: wake the export thread, or spill the queue, with the recorder no longer borrowed.
fn signal(rec: &Bound<'_, Recorder>, s: Signal) -> PyResult<()> {
    match s {
        Signal::None => Ok(()),
        Signal::Wake => {
            let wake = rec.try_borrow()?.wake.as_ref().map(|w| w.clone_ref(rec.py()));
            if let Some(w) = wake {
                w.call0(rec.py())?;
            }
            Ok(())
        }
        Signal::Spill => {
            let spill = rec.try_borrow()?.spill.as_ref().map(|w| w.clone_ref(rec.py()));
            match spill {
                Some(sp) => {
                    let (data, n, errors) = Recorder::drain(rec)?;
                    sp.call1(rec.py(), (data, n, errors))?;
                }
                None => rec.try_borrow_mut()?.max_events *= 2, // not bound to a worker: let it grow
            }
            Ok(())
        }
    }
}

fn push_signal(rec: &Bound<'_, Recorder>, ev: Ev) -> PyResult<()> {
    let s = rec.try_borrow_mut()?.push(ev);
    signal(rec, s)
}

fn hold_item(rec: &Bound<'_, Recorder>, item: Bound<'_, PyAny>) -> PyResult<()> {
    push_signal(rec, Ev::Item(item.unbind()))
}

/// A metric key's JSON, cached by key object.
fn key_json(rec: &Bound<'_, Recorder>, k: &Bound<'_, PyAny>) -> PyResult<Option<Chunk>> {
    if let Some((_, j)) = rec.try_borrow()?.keys.get(&(k.as_ptr() as usize)) {
        return Ok(Some(j.clone()));
    }
    let Some(j) = json_of(k) else { return Ok(None) };
    let j: Chunk = j.into();
    let mut me = rec.try_borrow_mut()?;
    if me.keys.len() < CACHE_MAX {
        me.keys.insert(k.as_ptr() as usize, (k.clone().unbind(), j.clone()));
    }
    Ok(Some(j))
}

#[pymethods]
impl Recorder {
    #[new]
    #[pyo3(signature = (base, *, hooks, slow_log, slow_metrics, encode_one, encode_attrs, root_span_id=None, sci_style=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        base: &[u8],
        hooks: Bound<'_, PyList>,
        slow_log: Py<PyAny>,
        slow_metrics: Py<PyAny>,
        encode_one: Py<PyAny>,
        encode_attrs: Py<PyAny>,
        root_span_id: Option<u64>,
        sci_style: u8,
    ) -> Recorder {
        SCI_STYLE.store(sci_style, Ordering::Relaxed);
        Recorder {
            base: base.into(),
            step: None,
            last_progress_ns: now_ns(),
            root_span_id,
            main_ident: thread_ident(),
            main: Vec::new(),
            others: HashMap::default(),
            ids: fresh_seed(),
            evs: Vec::with_capacity(1024),
            mvals: Vec::with_capacity(256),
            woken: false,
            batch: 16384,
            max_events: 200_000,
            in_coll: None,
            groups: HashMap::default(),
            spans: HashMap::default(),
            names: HashMap::default(),
            keys: HashMap::default(),
            strings: HashMap::default(),
            rss: None,
            rss_key: b"\"rss_bytes\"".to_vec().into(),
            hooks: hooks.unbind(),
            slow_log,
            slow_metrics,
            encode_one,
            encode_attrs,
            wake: None,
            spill: None,
            retired: None,
            spare: Buffers::default(),
        }
    }

    /// Where full batches and overflow go: the export worker's wake-up and spill file.
    #[pyo3(signature = (wake, spill, batch, max_events))]
    fn bind(&mut self, wake: Py<PyAny>, spill: Py<PyAny>, batch: usize, max_events: usize) {
        self.wake = Some(wake);
        self.spill = Some(spill);
        self.batch = batch.max(1);
        self.max_events = max_events.max(1);
    }

    /// Record host RSS (`rss_bytes`) at step ends, at most once per interval; false where /proc cannot be read.
    fn sample_rss(&mut self, interval_s: f64, page_size: i64) -> bool {
        self.rss = Rss::open((interval_s * 1e9) as i64, page_size);
        self.rss.is_some()
    }

    /// In a forked child: the parent exports what was queued; new ids, new identity fields.
    fn after_fork(slf: &Bound<'_, Self>, base: &[u8]) -> PyResult<()> {
        let dropped = {
            let mut me = slf.try_borrow_mut()?;
            let me = &mut *me;
            me.base = base.into();
            me.woken = false;
            me.ids = fresh_seed();
            me.wake = None;
            me.spill = None;
            if let Some(r) = &me.rss {
                me.rss = Rss::open(r.interval_ns, r.page); // /proc/self of the child, not the parent's
            }
            me.mvals.clear();
            (take(&mut me.evs), take(&mut me.in_coll))
        };
        drop(dropped); // the parent's queued Python objects, released with the recorder not borrowed
        Ok(())
    }

    /// A span context manager. Without a step or attributes it is one shared object per
    /// name and category (it keeps no state: the frames are on the recorder's stacks).
    #[pyo3(signature = (name, cat, step=None, attrs=None))]
    fn span(
        slf: &Bound<'_, Self>,
        name: &Bound<'_, PyAny>,
        cat: &Bound<'_, PyAny>,
        step: Option<&Bound<'_, PyAny>>,
        attrs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Span>> {
        let py = slf.py();
        let attrs = match attrs {
            Some(a) => given(a)?,
            None => None,
        };
        let step = step.filter(|s| !s.is_none());
        let key = (name.as_ptr() as usize, cat.as_ptr() as usize);
        let cacheable = step.is_none() && attrs.is_none();
        let named = {
            let me = slf.try_borrow()?;
            if cacheable {
                if let Some(s) = me.spans.get(&key) {
                    return Ok(s.clone_ref(py));
                }
            }
            me.names.get(&key).map(|(_, _, c)| c.clone())
        };
        let named = match named {
            Some(c) => Some(c),
            None => {
                let c = named_of(name, cat);
                if let Some(c) = &c {
                    let mut me = slf.try_borrow_mut()?;
                    if me.names.len() < CACHE_MAX {
                        me.names.insert(key, (name.clone().unbind(), cat.clone().unbind(), c.clone()));
                    }
                }
                c
            }
        };
        let is_step = cat.cast_exact::<PyString>().map(|c| c.to_str().map(|s| s == "step").unwrap_or(false)).unwrap_or(false);
        let (int_step, odd_step) = match step {
            None => (None, None),
            Some(s) => match exact_i64(s) {
                Some(i) => (Some(i), None),
                None => (None, Some(s.clone().unbind())),
            },
        };
        let span = Py::new(
            py,
            Span {
                core: slf.clone().unbind(),
                name: name.clone().unbind(),
                cat: cat.clone().unbind(),
                named,
                is_step,
                step: int_step,
                odd_step,
                attrs,
                last_id: AtomicU64::new(0),
            },
        )?;
        if cacheable {
            let mut me = slf.try_borrow_mut()?;
            if me.spans.len() < CACHE_MAX {
                me.spans.insert(key, span.clone_ref(py));
            }
        }
        Ok(span)
    }

    /// `otel_instrumentation.step(i, **attrs)` while this recorder traces (`_setup` binds it): one C
    /// call where the package's function is a Python frame and then one (~1.2 µs a call in a step).
    #[pyo3(signature = (i, **attrs))]
    fn step_span(slf: &Bound<'_, Self>, i: &Bound<'_, PyAny>, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        entry_span(slf, intern!(py, "step"), intern!(py, "step"), Some(i), attrs)
    }

    /// `otel_instrumentation.phase(name, **attrs)` while this recorder traces.
    #[pyo3(signature = (name, **attrs))]
    fn phase(slf: &Bound<'_, Self>, name: &Bound<'_, PyAny>, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        entry_span(slf, name, intern!(slf.py(), "phase"), None, attrs)
    }

    /// `otel_instrumentation.span(name, **attrs)` while this recorder traces.
    #[pyo3(signature = (name, **attrs))]
    fn user_span(slf: &Bound<'_, Self>, name: &Bound<'_, PyAny>, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        entry_span(slf, name, intern!(slf.py(), "user"), None, attrs)
    }

    /// `otel_instrumentation.log_metrics(step=None, **values)` while this recorder traces.
    #[pyo3(signature = (step=None, **values))]
    fn log_metrics(slf: &Bound<'_, Self>, step: Option<&Bound<'_, PyAny>>, values: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let py = slf.py();
        if slf.try_borrow()?.retired.is_some() {
            return Ok(());
        }
        let none = py.None().into_bound(py);
        let fresh;
        let values = match values {
            Some(v) => v,
            None => {
                fresh = PyDict::new(py);
                &fresh
            }
        };
        Self::metrics(slf, step.unwrap_or(&none), values.as_any())
    }

    /// Tracing stopped: entry points a script still holds return `null` and record nothing.
    fn retire(&mut self, null: Py<PyAny>) {
        self.retired = Some(null);
    }

    /// The innermost span of the calling thread (or the root span) as an int.
    fn current_span_id(&self) -> Option<u64> {
        self.top_id()
    }

    /// The calling thread's innermost step span (or the root span), for `otel_context="step"`.
    fn current_step_span_id(&self, py: Python<'_>) -> Option<u64> {
        self.stack_ref()
            .and_then(|s| s.iter().rev().find(|f| f.span.bind(py).get().is_step))
            .map(|f| f.id)
            .or(self.root_span_id)
    }

    /// The main thread's innermost span as `(name, cat, start_ns)`, for the heartbeat thread.
    fn top(slf: &Bound<'_, Self>) -> PyResult<Option<(Py<PyAny>, Py<PyAny>, i64)>> {
        let py = slf.py();
        let me = slf.try_borrow()?;
        Ok(me.main.last().map(|f| {
            let s = f.span.bind(py).get();
            (s.name.clone_ref(py), s.cat.clone_ref(py), f.start)
        }))
    }

    /// What the rank is blocked in: `(op, group, seq, t0_ns, bytes)` or None.
    #[getter]
    fn in_collective(slf: &Bound<'_, Self>) -> PyResult<Option<(Py<PyString>, Py<PyAny>, i64, i64, i64)>> {
        let py = slf.py();
        let me = slf.try_borrow()?;
        Ok(me.in_coll.as_ref().map(|c| (c.op.clone_ref(py), c.group.clone_ref(py), c.seq, c.t0, c.bytes)))
    }

    /// Events queued and not yet drained.
    #[getter]
    fn pending(&self) -> usize {
        self.evs.len()
    }

    /// The hot path of every logging call: the record's fields, formatted by the drain.
    #[pyo3(signature = (record, progress=true))]
    fn log_record<'py>(slf: &Bound<'py, Self>, record: &Bound<'py, PyAny>, progress: bool) -> PyResult<()> {
        let py = slf.py();
        // One read of the instance dict, then dict lookups (a getattr also searches the class first).
        let Ok(d) = record.getattr(intern!(py, "__dict__")).and_then(|d| Ok(d.cast_into::<PyDict>()?)) else {
            return slow(slf, record, progress);
        };
        let get = |k: &Bound<'py, PyString>| d.get_item(k).ok().flatten();
        let (Some(name), Some(msg), Some(args), Some(created), Some(level)) = (
            get(intern!(py, "name")),
            get(intern!(py, "msg")),
            get(intern!(py, "args")),
            get(intern!(py, "created")),
            get(intern!(py, "levelname")),
        ) else {
            return slow(slf, record, progress);
        };
        if let Ok(n) = name.cast::<PyString>() {
            if n.to_str().map(|s| s.starts_with("jobtrace.export")).unwrap_or(false) {
                return Ok(()); // the exporter's own warnings must not loop back into its queue
            }
        }
        let args = if args.is_none() || !args.is_truthy()? {
            None
        } else if let Ok(t) = args.cast_exact::<PyTuple>() {
            let immutable = t.iter().all(|a| {
                a.is_none()
                    || a.is_exact_instance_of::<PyString>()
                    || a.is_exact_instance_of::<PyInt>()
                    || a.is_exact_instance_of::<PyFloat>()
                    || a.is_exact_instance_of::<PyBool>()
                    || a.is_exact_instance_of::<PyBytes>()
                    || a.is_exact_instance_of::<pyo3::types::PyComplex>()
            });
            if !immutable {
                return slow(slf, record, progress); // an argument could change before the drain: format now
            }
            Some(args.unbind())
        } else {
            return slow(slf, record, progress);
        };
        let truthy = |k: &Bound<'py, PyString>| get(k).map(|v| !v.is_none() && v.is_truthy().unwrap_or(true)).unwrap_or(false);
        if truthy(intern!(py, "exc_info")) || truthy(intern!(py, "exc_text")) {
            return slow(slf, record, progress); // rare: an exception's text
        }
        let Some(created) = created.cast_exact::<PyFloat>().ok().map(|f| f.value()) else {
            return slow(slf, record, progress);
        };
        let s = {
            let mut me = slf.try_borrow_mut()?;
            if progress && thread_ident() == me.main_ident {
                me.last_progress_ns = now_ns();
            }
            let (sid, step) = (me.top_id(), me.step);
            me.push(Ev::Log { created, level: level.unbind(), logger: name.unbind(), msg: msg.unbind(), args, exc: None, sid, step })
        };
        signal(slf, s)
    }

    /// A log record's fields, prepared by Python (`_recorder.log_fields`): the slow path's queue.
    #[pyo3(signature = (created, level, logger, msg, args, exc, progress=true))]
    #[allow(clippy::too_many_arguments)]
    fn push_log(
        slf: &Bound<'_, Self>,
        created: &Bound<'_, PyAny>,
        level: &Bound<'_, PyAny>,
        logger: &Bound<'_, PyAny>,
        msg: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        exc: &Bound<'_, PyAny>,
        progress: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let (sid, step) = {
            let mut me = slf.try_borrow_mut()?;
            if progress && thread_ident() == me.main_ident {
                me.last_progress_ns = now_ns();
            }
            (me.top_id(), me.step)
        };
        let Some(created_f) = created.cast_exact::<PyFloat>().ok().map(|f| f.value()) else {
            let item = PyTuple::new(py, [LOG.into_pyobject(py)?.into_any(), created.clone(), level.clone(), logger.clone(),
                msg.clone(), args.clone(), exc.clone(), sid.into_pyobject(py)?.into_any(), step.into_pyobject(py)?.into_any()])?;
            return hold_item(slf, item.into_any());
        };
        push_signal(slf, Ev::Log {
            created: created_f,
            level: level.clone().unbind(),
            logger: logger.clone().unbind(),
            msg: msg.clone().unbind(),
            args: given(args)?,
            exc: given(exc)?,
            sid,
            step,
        })
    }

    /// `log_metrics`: plain numbers (and CPU tensors, read now) queued here; anything else by Python.
    #[pyo3(signature = (step, values))]
    fn metrics(slf: &Bound<'_, Self>, step: &Bound<'_, PyAny>, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let slow = || -> PyResult<()> {
            let f = slf.try_borrow()?.slow_metrics.clone_ref(py);
            f.call1(py, (step, values))?;
            Ok(())
        };
        let Some(step) = opt_i64(step) else { return slow() };
        let Ok(d) = values.cast::<PyDict>() else { return slow() };
        let mut vals: Vec<(Chunk, Num)> = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Some(key) = key_json(slf, &k)? else { return slow() };
            let n = match number(&v) {
                Some(n) => n,
                None => {
                    // A CPU tensor's value is read now, as the Python recorder does (see its `metrics`).
                    let cpu = v.getattr(intern!(py, "is_cpu")).map(|c| c.is_truthy().unwrap_or(false)).unwrap_or(false);
                    match cpu.then(|| v.call_method0(intern!(py, "item")).ok()).flatten().and_then(|x| number(&x)) {
                        Some(n) => n,
                        None => return slow(),
                    }
                }
            };
            vals.push((key, n));
        }
        let s = {
            let mut me = slf.try_borrow_mut()?;
            let ts = now_ns();
            let (sid, step) = (me.top_id(), step.or(me.step));
            me.push_metric(ts, sid, step, vals.into_iter())
        };
        signal(slf, s)
    }

    /// Queue an item in `_recorder.py`'s layout: spans and plain metric points are written by the
    /// drain, log records formatted there, anything else encoded by Python at the drain.
    fn emit(slf: &Bound<'_, Self>, item: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let Ok(t) = item.cast_exact::<PyTuple>() else { return hold_item(slf, item.clone()) };
        let tag = t.get_item(0).ok().and_then(|x| exact_i64(&x));
        let f = |i: usize| t.get_item(i);
        match (tag, t.len()) {
            (Some(SPAN), 9) => {
                let (sid, parent, start, end, step, attrs) = (f(1)?, f(2)?, f(5)?, f(6)?, f(7)?, f(8)?);
                let parts = (exact_u64(&sid), opt_u64(&parent), named_of(&f(3)?, &f(4)?), exact_i64(&start),
                             exact_i64(&end), opt_i64(&step));
                let (Some(sid), Some(parent), Some(named), Some(start), Some(end), Some(step)) = parts else {
                    return hold_item(slf, item.clone());
                };
                let attrs = if given(&attrs)?.is_none() {
                    None
                } else {
                    let enc = slf.try_borrow()?.encode_attrs.clone_ref(py);
                    match enc.call1(py, (&attrs,)).and_then(|b| b.extract::<Vec<u8>>(py)) {
                        Ok(b) => Some(b.into_boxed_slice()),
                        Err(_) => return hold_item(slf, item.clone()),
                    }
                };
                push_signal(slf, Ev::Span { sid, parent, named, start, end, step, attrs })
            }
            (Some(METRIC), 5) => {
                let (ts, step, values, sid) = (f(1)?, f(2)?, f(3)?, f(4)?);
                if let (Some(ts), Some(step), Some(sid), Ok(d)) = (exact_i64(&ts), opt_i64(&step), opt_u64(&sid), values.cast::<PyDict>()) {
                    let mut vals = Vec::with_capacity(d.len());
                    for (k, v) in d.iter() {
                        match (key_json(slf, &k)?, number(&v)) {
                            (Some(k), Some(n)) => vals.push((k, n)),
                            _ => return hold_item(slf, item.clone()),
                        }
                    }
                    let s = slf.try_borrow_mut()?.push_metric(ts, sid, step, vals.into_iter());
                    return signal(slf, s);
                }
                hold_item(slf, item.clone())
            }
            (Some(LOG), 9) => {
                let (created, sid, step) = (f(1)?, f(7)?, f(8)?);
                match (created.cast_exact::<PyFloat>().ok().map(|c| c.value()), opt_u64(&sid), opt_i64(&step)) {
                    (Some(created), Some(sid), Some(step)) => {
                        let (args, exc) = (f(5)?, f(6)?);
                        push_signal(slf, Ev::Log {
                            created,
                            level: f(2)?.unbind(),
                            logger: f(3)?.unbind(),
                            msg: f(4)?.unbind(),
                            args: given(&args)?,
                            exc: given(&exc)?,
                            sid,
                            step,
                        })
                    }
                    _ => hold_item(slf, item.clone()),
                }
            }
            _ => hold_item(slf, item.clone()),
        }
    }

    /// Wrap a `torch.distributed` collective: the call is recorded as a span of category
    /// `collective` with op, group, group size, per-group sequence number and bytes.
    /// `describe(group)` gives a group's `(name, size)` once; `payload_bytes(obj)` sizes
    /// what has no `nbytes` of its own (a list of tensors).
    fn wrap_collective(
        slf: &Bound<'_, Self>,
        fn_: Py<PyAny>,
        op: &Bound<'_, PyString>,
        describe: Py<PyAny>,
        group_type: Py<PyAny>,
        payload_bytes: Py<PyAny>,
    ) -> PyResult<Collective> {
        let op_json: Option<Chunk> = json_of(op.as_any()).map(Into::into);
        Ok(Collective { core: slf.clone().unbind(), fn_, op: op.clone().unbind(), op_json, describe, group_type, payload_bytes })
    }

    /// Everything queued, as event lines: `(bytes, lines, events that could not be encoded)`.
    /// Runs on the export thread: spans, collectives and metric points are written with the
    /// GIL released, then the log records and Python's items with it.
    fn drain(slf: &Bound<'_, Self>) -> PyResult<(Py<PyBytes>, usize, usize)> {
        let py = slf.py();
        let (evs, mvals, mut out, mut full, mut strings, base, encode_one) = {
            let mut me = slf.try_borrow_mut()?;
            me.woken = false;
            let Buffers { evs: empty_evs, mvals: empty_mvals, out, full } = take(&mut me.spare);
            let evs = std::mem::replace(&mut me.evs, empty_evs);
            let mvals = std::mem::replace(&mut me.mvals, empty_mvals);
            (evs, mvals, out, full, take(&mut me.strings), me.base.clone(), me.encode_one.clone_ref(py))
        };
        let n = evs.len();
        let holes = py.detach(|| {
            out.reserve(n * 320);
            let mut holes: Vec<(usize, usize)> = Vec::new();
            for (i, ev) in evs.iter().enumerate() {
                if !encode(&mut out, &base, ev, &mvals) {
                    holes.push((out.len(), i));
                }
            }
            holes
        });
        let errors = if holes.is_empty() {
            0
        } else {
            let errors = splice_python_lines(py, &out, &mut full, holes, &evs, &mut strings, &base, &encode_one)?;
            std::mem::swap(&mut out, &mut full);
            errors
        };
        let lines = PyBytes::new(py, &out).unbind();
        // Emptied for the next drain: the held Python objects released with the GIL held and the recorder not borrowed.
        let spare = Buffers { evs, mvals, out, full }.recycle();
        let mut me = slf.try_borrow_mut()?;
        me.strings = strings;
        me.spare = spare;
        Ok((lines, n - errors, errors))
    }
}

/// `out` with the lines the drain left out (log records, Python's items) written into their places, into
/// `full`: log records formatted here, the rest by the Python encoder. Returns how many could not be encoded.
#[allow(clippy::too_many_arguments)]
fn splice_python_lines(
    py: Python<'_>,
    out: &[u8],
    full: &mut Vec<u8>,
    holes: Vec<(usize, usize)>,
    evs: &[Ev],
    strings: &mut HashMap<String, Vec<u8>>,
    base: &[u8],
    encode_one: &Py<PyAny>,
) -> PyResult<usize> {
    full.reserve(out.len() + holes.len() * 320);
    let (mut prev, mut errors) = (0, 0);
    for (at, i) in holes {
        full.extend_from_slice(&out[prev..at]);
        prev = at;
        let item = match &evs[i] {
            Ev::Log { created, level, logger, msg, args, exc, sid, step } => {
                if log_line(py, full, strings, base, *created, level, logger, msg, args, exc, *sid, *step) {
                    continue;
                }
                let none = || py.None().into_bound(py);
                PyTuple::new(py, [LOG.into_pyobject(py)?.into_any(), created.into_pyobject(py)?.into_any(),
                    level.bind(py).clone(), logger.bind(py).clone(), msg.bind(py).clone(),
                    args.as_ref().map(|a| a.bind(py).clone()).unwrap_or_else(none),
                    exc.as_ref().map(|a| a.bind(py).clone()).unwrap_or_else(none),
                    sid.into_pyobject(py)?.into_any(), step.into_pyobject(py)?.into_any()])?.into_any()
            }
            Ev::Item(it) => it.bind(py).clone(),
            _ => continue, // written by the drain
        };
        match encode_one.call1(py, (item,)).and_then(|b| b.extract::<Vec<u8>>(py)) {
            Ok(line) => full.extend_from_slice(&line),
            Err(_) => errors += 1,
        }
    }
    full.extend_from_slice(&out[prev..]);
    Ok(errors)
}

/// A common log record's line as `_encode_log` writes it; false sends it to the Python encoder.
#[allow(clippy::too_many_arguments)]
fn log_line(
    py: Python<'_>,
    out: &mut Vec<u8>,
    strings: &mut HashMap<String, Vec<u8>>,
    base: &[u8],
    created: f64,
    level: &Py<PyAny>,
    logger: &Py<PyAny>,
    msg: &Py<PyAny>,
    args: &Option<Py<PyAny>>,
    exc: &Option<Py<PyAny>>,
    sid: Option<u64>,
    step: Option<i64>,
) -> bool {
    let msg = msg.bind(py);
    if !msg.is_exact_instance_of::<PyString>() {
        return false;
    }
    let formatted;
    let text = match args {
        Some(a) => match msg.rem(a.bind(py)) {
            Ok(m) => {
                formatted = m;
                formatted.cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok())
            }
            Err(_) => None, // the Python encoder writes the format error
        },
        None => msg.cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok()),
    };
    let Some(text) = text else { return false };
    let exc_text = match exc {
        None => None,
        Some(e) => match e.bind(py).cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok()) {
            Some(s) => Some(s),
            None => return false,
        },
    };
    for v in [level, logger] {
        let Some(s) = v.bind(py).cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok()) else { return false };
        if !strings.contains_key(s) && strings.len() < CACHE_MAX {
            let mut j = Vec::with_capacity(s.len() + 2);
            json_str(&mut j, s.as_bytes());
            strings.insert(s.to_owned(), j);
        }
    }
    let json = |v: &Py<PyAny>, out: &mut Vec<u8>| {
        let s = v.bind(py).cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok()).unwrap_or_default();
        match strings.get(s) {
            Some(j) => out.extend_from_slice(j),
            None => json_str(out, s.as_bytes()), // the cache is full
        }
    };
    out.extend_from_slice(b"{\"ts\":");
    push_int(out, (created * 1e9) as i64);
    out.extend_from_slice(b",\"kind\":\"log\",");
    out.extend_from_slice(base);
    push_id(out, b",\"span_id\":\"", sid);
    out.extend_from_slice(b",\"level\":");
    json(level, out);
    out.extend_from_slice(b",\"logger\":");
    json(logger, out);
    out.extend_from_slice(b",\"msg\":");
    json_str(out, text.as_bytes());
    if let Some(e) = exc_text {
        out.extend_from_slice(b",\"exc\":");
        json_str(out, e.as_bytes());
    }
    push_step(out, step);
    out.extend_from_slice(b"}\n");
    true
}

fn slow(rec: &Bound<'_, Recorder>, record: &Bound<'_, PyAny>, progress: bool) -> PyResult<()> {
    let f = rec.try_borrow()?.slow_log.clone_ref(rec.py());
    f.call1(rec.py(), (record, progress))?;
    Ok(())
}

/// `with rec.span(...)`: enter pushes a frame on the calling thread's stack, exit queues the span.
#[pyclass(frozen, module = "jobtrace_native")]
pub struct Span {
    core: Py<Recorder>,
    #[pyo3(get)]
    name: Py<PyAny>,
    #[pyo3(get)]
    cat: Py<PyAny>,
    /// `,"name":…,"cat":…`; None when either is not valid text (the Python encoder writes it).
    named: Option<Chunk>,
    is_step: bool,
    step: Option<i64>,
    /// A step that is not an int: its span is written by the Python encoder, and not carried to phases.
    odd_step: Option<Py<PyAny>>,
    attrs: Option<Py<PyAny>>,
    /// The id of the frame this object last entered (`with rec.span(...) as s: s.span_id`). One object
    /// serves every use of a name without a step or attributes, so it is the latest such span's id.
    last_id: AtomicU64,
}

#[pymethods]
impl Span {
    #[getter]
    fn span_id(&self) -> Option<u64> {
        match self.last_id.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let py = slf.py();
        let this = slf.get();
        let core = this.core.bind(py);
        {
            let mut me = core.try_borrow_mut()?;
            let step = match this.step {
                Some(s) => {
                    if this.is_step {
                        me.step = Some(s);
                    }
                    Some(s)
                }
                None if this.odd_step.is_some() => None,
                None => me.step,
            };
            let id = me.next_id();
            this.last_id.store(id, Ordering::Relaxed);
            let root = me.root_span_id;
            let span = slf.clone().unbind();
            let stack = me.stack();
            let parent = stack.last().map(|f| f.id).or(root);
            stack.push(Frame { span, id, parent, start: now_ns(), step });
        }
        Ok(slf)
    }

    #[pyo3(signature = (exc_type=None, exc=None, _tb=None))]
    fn __exit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let end = now_ns();
        let py = slf.py();
        let this = slf.get();
        let core = this.core.bind(py);
        // Attributes (rare): with an error, a dict as the Python recorder builds it; encoded before borrowing.
        let attrs: Option<Bound<'_, PyAny>> = match exc_type {
            Some(t) if !t.is_none() => {
                let d = PyDict::new(py);
                if let Some(a) = &this.attrs {
                    d.update(a.bind(py).cast::<pyo3::types::PyMapping>()?)?;
                }
                let text = t.getattr(intern!(py, "__name__"))?.str()?.add(": ")?;
                let text = text.add(exc.map(|e| e.str()).transpose()?.map(|s| s.into_any()).unwrap_or_else(|| PyString::new(py, "None").into_any()))?;
                d.set_item("error", text)?;
                Some(d.into_any())
            }
            _ => this.attrs.as_ref().map(|a| a.bind(py).clone()),
        };
        let encoded: Option<Box<[u8]>> = match &attrs {
            None => None,
            Some(a) => {
                let enc = core.try_borrow()?.encode_attrs.clone_ref(py);
                enc.call1(py, (a,)).and_then(|b| b.extract::<Vec<u8>>(py)).ok().map(Vec::into_boxed_slice)
            }
        };
        let native = this.named.is_some() && this.odd_step.is_none() && (attrs.is_none() || encoded.is_some());
        let (frame, s, hooks) = {
            let mut me = core.try_borrow_mut()?;
            let me = &mut *me;
            let target = slf.as_ptr();
            let stack = me.stack();
            let frame = match stack.last() {
                Some(f) if f.span.as_ptr() == target => stack.pop(),
                _ => stack.iter().rposition(|f| f.span.as_ptr() == target).map(|i| stack.remove(i)),
            };
            let Some(frame) = frame else { return Ok(false) }; // exited without entering: nothing to record
            me.last_progress_ns = end;
            let mut s = match (&this.named, native) {
                (Some(named), true) => me.push(Ev::Span {
                    sid: frame.id,
                    parent: frame.parent,
                    named: named.clone(),
                    start: frame.start,
                    end,
                    step: frame.step,
                    attrs: encoded,
                }),
                _ => Signal::None,
            };
            let mut hooks = None;
            if this.is_step {
                if let Some(rss) = &mut me.rss {
                    if end >= rss.next_ns {
                        rss.next_ns = end + rss.interval_ns;
                        if let Some(bytes) = rss.read() {
                            let (root, key) = (me.root_span_id, me.rss_key.clone());
                            let s2 = me.push_metric(end, root, frame.step, std::iter::once((key, Num::I(bytes))));
                            if s == Signal::None {
                                s = s2;
                            }
                        }
                    }
                }
                if !me.hooks.bind(py).is_empty() {
                    hooks = Some(me.hooks.clone_ref(py));
                }
            }
            (frame, s, hooks)
        };
        if !native {
            let step = match &this.odd_step {
                Some(o) => o.bind(py).clone(),
                None => frame.step.into_pyobject(py)?.into_any(),
            };
            let item = PyTuple::new(py, [SPAN.into_pyobject(py)?.into_any(), frame.id.into_pyobject(py)?.into_any(),
                frame.parent.into_pyobject(py)?.into_any(), this.name.bind(py).clone(), this.cat.bind(py).clone(),
                frame.start.into_pyobject(py)?.into_any(), end.into_pyobject(py)?.into_any(), step,
                attrs.unwrap_or_else(|| py.None().into_bound(py))])?;
            hold_item(core, item.into_any())?;
        }
        signal(core, s)?;
        if let Some(hooks) = hooks {
            let step = frame.step;
            drop(frame);
            for hook in hooks.bind(py).iter() {
                hook.call1((step,))?;
            }
        }
        Ok(false)
    }
}

/// A `torch.distributed` collective, wrapped (`Recorder.wrap_collective`).
#[pyclass(frozen, dict, module = "jobtrace_native")]
pub struct Collective {
    core: Py<Recorder>,
    fn_: Py<PyAny>,
    op: Py<PyString>,
    op_json: Option<Chunk>,
    describe: Py<PyAny>,
    group_type: Py<PyAny>,
    payload_bytes: Py<PyAny>,
}

#[pymethods]
impl Collective {
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Py<PyAny>> {
        let core = self.core.bind(py);
        let kw = |k: &Bound<'py, PyString>| -> Option<Bound<'py, PyAny>> { kwargs.and_then(|d| d.get_item(k).ok().flatten()) };
        let mut group = kw(intern!(py, "group")).filter(|g| !g.is_none());
        if group.is_none() && args.len() > 1 {
            let gt = self.group_type.bind(py);
            group = args.iter().skip(1).find(|a| a.is_instance(gt).unwrap_or(false));
        }
        let key = group.as_ref().map(|g| g.as_ptr() as usize).unwrap_or(0);
        let first = if !args.is_empty() {
            Some(args.get_item(0)?)
        } else {
            kw(intern!(py, "tensor")).or_else(|| kw(intern!(py, "tensor_list")))
        };
        let first = first.unwrap_or_else(|| py.None().into_bound(py));
        let payload = match first.getattr(intern!(py, "nbytes")).ok().and_then(|n| exact_i64(&n)) {
            Some(n) => n,
            None => self.payload_bytes.call1(py, (&first,))?.extract::<i64>(py).unwrap_or(0),
        };
        let is_async = match kw(intern!(py, "async_op")) {
            Some(a) => a.is_truthy().unwrap_or(false),
            None => false,
        };
        if !core.try_borrow()?.groups.contains_key(&key) {
            let g = group.as_ref().map(|g| g.clone()).unwrap_or_else(|| py.None().into_bound(py));
            let (name, size): (Bound<'_, PyAny>, i64) = self.describe.call1(py, (g,))?.extract(py)?;
            let name_json = json_of(&name).map(Into::into);
            core.try_borrow_mut()?.groups.insert(key, Group { name: name.unbind(), name_json, size, seq: 0 });
        }
        let (sid, parent, step, seq, t0) = {
            let mut me = core.try_borrow_mut()?;
            let me = &mut *me;
            let g = me.groups.get_mut(&key).expect("described above");
            g.seq += 1;
            let (seq, gname) = (g.seq, g.name.clone_ref(py));
            let sid = me.next_id();
            let t0 = now_ns();
            me.in_coll = Some(InCollective { op: self.op.clone_ref(py), group: gname, seq, t0, bytes: payload });
            (sid, me.top_id(), me.step, seq, t0)
        };
        let result = self.fn_.bind(py).call(args, kwargs);
        let t1 = now_ns();
        let error: Option<Bound<'_, PyAny>> = match &result {
            Ok(_) => None,
            Err(e) => {
                let name = e.get_type(py).getattr(intern!(py, "__name__"))?.str()?;
                Some(name.add(": ")?.add(e.value(py).str()?)?)
            }
        };
        let error_json: Option<Option<Box<[u8]>>> = error.as_ref().map(|e| json_of(e).map(Vec::into_boxed_slice));
        let error_ok = !matches!(error_json, Some(None));
        let s = {
            let mut me = core.try_borrow_mut()?;
            let me = &mut *me;
            me.in_coll = None;
            me.last_progress_ns = t1;
            let g = &me.groups[&key];
            match (&self.op_json, &g.name_json) {
                (Some(op), Some(group)) if error_ok => {
                    let (op, group, size) = (op.clone(), group.clone(), g.size);
                    Some(me.push(Ev::Coll {
                        sid, parent, op, group, size, seq, bytes: payload, start: t0, end: t1, step, is_async,
                        error: error_json.flatten(),
                    }))
                }
                _ => None, // text that is not valid UTF-8: the Python encoder writes it
            }
        };
        match s {
            Some(s) => signal(core, s)?,
            None => {
                let (gname, gsize) = {
                    let me = core.try_borrow()?;
                    let g = &me.groups[&key];
                    (g.name.clone_ref(py), g.size)
                };
                let extra = PyDict::new(py);
                if is_async {
                    extra.set_item("async", true)?;
                }
                if let Some(e) = &error {
                    extra.set_item("error", e)?;
                }
                let group = PyList::new(py, [gname.into_bound(py), gsize.into_pyobject(py)?.into_any(), seq.into_pyobject(py)?.into_any()])?;
                let item = PyTuple::new(py, [4i64.into_pyobject(py)?.into_any(), sid.into_pyobject(py)?.into_any(),
                    parent.into_pyobject(py)?.into_any(), self.op.bind(py).clone().into_any(), t0.into_pyobject(py)?.into_any(),
                    t1.into_pyobject(py)?.into_any(), step.into_pyobject(py)?.into_any(), group.into_any(),
                    seq.into_pyobject(py)?.into_any(), payload.into_pyobject(py)?.into_any(),
                    if extra.is_empty() { py.None().into_bound(py) } else { extra.into_any() }])?;
                hold_item(core, item.into_any())?;
            }
        }
        result.map(|r| r.unbind())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Recorder>()?;
    m.add_class::<Span>()?;
    m.add_class::<Collective>()?;
    Ok(())
}
