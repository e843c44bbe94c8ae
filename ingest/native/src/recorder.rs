//! The training thread's recorder, compiled: spans, collectives, metric points and log
//! records written as event lines into one byte buffer, with no Python object per event.
//!
//! `otel_instrumentation/_recorder.py` is the reference. In a training step each of its
//! calls runs once, on caches the model's kernels have just evicted, where every line of
//! Python costs about a microsecond; the demo's step paid ~50 µs on the training thread
//! and ~37 µs on the export thread for its eight events (`benchmarks/demo_calls.py`).
//! Here a span's enter and exit are one C call each, its line is written at exit (ids as
//! hex, the identity fields copied from one pre-encoded chunk), and the export thread only
//! takes the buffer (`Recorder.drain`).
//!
//! What is not common is handed to Python, never dropped: a log record whose arguments
//! could change (formatted by Python first), one with an exception, a metric value that
//! is not a number or a CPU tensor, attributes that need `orjson`, text that is not valid
//! UTF-8. Such events are *held* in the buffer's order, and the drain encodes them with
//! the Python encoder, so a line never depends on which recorder wrote it
//! (`tests/otel_instrumentation/test_native_recorder.py` compares the two byte for byte).
//!
//! Locking: every method borrows the recorder only while it runs Rust code. Python code
//! (a hook, an `orjson` call, even an allocation that may start the garbage collector)
//! can switch threads, and the heartbeat and export threads borrow the recorder too, so
//! such calls happen before or after a borrow, never inside one.

use std::mem::take;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustc_hash::FxHashMap as HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::json::{json_str, push_float, push_hex16, push_int};

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

/// Valid UTF-8 text of an exact `str`, JSON-encoded; `None` for anything else (Python's path).
fn json_of(v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let s = v.cast_exact::<PyString>().ok()?.to_str().ok()?;
    let mut out = Vec::with_capacity(s.len() + 2);
    json_str(&mut out, s.as_bytes());
    Some(out)
}

/// How the installed orjson writes an exponent: 0 unknown (such floats go to Python), 1 `1e16`, 2 `1e+16`.
static SCI_STYLE: AtomicU8 = AtomicU8::new(0);

/// A metric value as `_recorder._number` writes it, when it is a plain number.
fn push_number(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> bool {
    if v.is_exact_instance_of::<PyFloat>() {
        let x: f64 = v.extract().unwrap_or(f64::NAN);
        if x.is_finite() {
            let style = match SCI_STYLE.load(Ordering::Relaxed) {
                1 => Some(false),
                2 => Some(true),
                _ => None,
            };
            return push_float(out, x, style);
        } else if x.is_nan() {
            out.extend_from_slice(b"\"NaN\"");
        } else {
            out.extend_from_slice(if x > 0.0 { b"\"Infinity\"" } else { b"\"-Infinity\"" });
        }
        true
    } else if v.is_exact_instance_of::<PyBool>() {
        out.push(if v.is_truthy().unwrap_or(false) { b'1' } else { b'0' });
        true
    } else if let Some(i) = exact_i64(v) {
        push_int(out, i);
        true
    } else {
        false
    }
}

/// What an event's write asks of its caller once the recorder is no longer borrowed.
#[derive(PartialEq)]
enum Signal {
    None,
    /// A batch is waiting: wake the export thread (once per batch).
    Wake,
    /// The buffer is full (the sinks cannot keep up): write it to the spill file now.
    Spill,
}

struct Frame {
    span: Py<Span>,
    id: u64,
    parent: Option<u64>,
    start: i64,
    step: Option<i64>,
}

/// An event the drain encodes with the Python encoder, or (a common log record) formats first.
enum Held {
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

struct Group {
    name: Py<PyAny>,
    name_json: Option<Vec<u8>>,
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

/// The hot path of one process's tracing; `otel_instrumentation._native.NativeRecorder` wraps it.
#[pyclass(module = "jobtrace_native")]
pub struct Recorder {
    base: Vec<u8>,
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
    buf: Vec<u8>,
    held: Vec<(usize, Held)>,
    events: usize,
    woken: bool,
    batch: usize,
    max_events: usize,
    in_coll: Option<InCollective>,
    groups: HashMap<usize, Group>,
    spans: HashMap<(usize, usize), Py<Span>>,
    strings: HashMap<String, Vec<u8>>,
    hooks: Py<PyList>,
    slow_log: Py<PyAny>,
    slow_metrics: Py<PyAny>,
    encode_one: Py<PyAny>,
    encode_attrs: Py<PyAny>,
    wake: Option<Py<PyAny>>,
    spill: Option<Py<PyAny>>,
}

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

    fn note_event(&mut self) -> Signal {
        self.events += 1;
        if self.events >= self.max_events {
            Signal::Spill
        } else if self.events >= self.batch && !self.woken {
            self.woken = true;
            Signal::Wake
        } else {
            Signal::None
        }
    }

    fn head(&mut self, ts: i64, kind: &[u8]) {
        let b = &mut self.buf;
        b.extend_from_slice(b"{\"ts\":");
        push_int(b, ts);
        b.extend_from_slice(b",\"kind\":\"");
        b.extend_from_slice(kind);
        b.extend_from_slice(b"\",");
        b.extend_from_slice(&self.base);
    }

    /// `_encode_span`'s line; `named` is `,"name":…,"cat":…`, `attrs` the JSON object or nothing.
    #[allow(clippy::too_many_arguments)]
    fn span_line(&mut self, sid: u64, parent: Option<u64>, named: &[u8], start: i64, end: i64, step: Option<i64>, attrs: &[&[u8]]) {
        self.head(end, b"span");
        let b = &mut self.buf;
        b.extend_from_slice(b",\"span_id\":\"");
        push_hex16(b, sid);
        b.push(b'"');
        if let Some(p) = parent {
            b.extend_from_slice(b",\"parent_id\":\"");
            push_hex16(b, p);
            b.push(b'"');
        }
        b.extend_from_slice(named);
        b.extend_from_slice(b",\"start\":");
        push_int(b, start);
        b.extend_from_slice(b",\"dur\":");
        push_int(b, end - start);
        if let Some(s) = step {
            b.extend_from_slice(b",\"step\":");
            push_int(b, s);
        }
        if !attrs.is_empty() {
            b.extend_from_slice(b",\"attrs\":");
            for part in attrs {
                b.extend_from_slice(part);
            }
        }
        b.extend_from_slice(b"}\n");
    }

    fn metric_line(&mut self, ts: i64, sid: Option<u64>, metrics: &[u8], step: Option<i64>) {
        self.head(ts, b"metric");
        let b = &mut self.buf;
        if let Some(s) = sid {
            b.extend_from_slice(b",\"span_id\":\"");
            push_hex16(b, s);
            b.push(b'"');
        }
        b.extend_from_slice(b",\"metrics\":");
        b.extend_from_slice(metrics);
        if let Some(s) = step {
            b.extend_from_slice(b",\"step\":");
            push_int(b, s);
        }
        b.extend_from_slice(b"}\n");
    }

    fn hold(&mut self, h: Held) -> Signal {
        let at = self.buf.len();
        self.held.push((at, h));
        self.note_event()
    }
}

/// After a write: wake the export thread, or spill the buffer, with the recorder no longer borrowed.
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

fn hold_item(rec: &Bound<'_, Recorder>, item: Bound<'_, PyAny>) -> PyResult<()> {
    let s = rec.try_borrow_mut()?.hold(Held::Item(item.unbind()));
    signal(rec, s)
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
            base: base.to_vec(),
            step: None,
            last_progress_ns: now_ns(),
            root_span_id,
            main_ident: thread_ident(),
            main: Vec::new(),
            others: HashMap::default(),
            ids: fresh_seed(),
            buf: Vec::with_capacity(1 << 16),
            held: Vec::new(),
            events: 0,
            woken: false,
            batch: 16384,
            max_events: 200_000,
            in_coll: None,
            groups: HashMap::default(),
            spans: HashMap::default(),
            strings: HashMap::default(),
            hooks: hooks.unbind(),
            slow_log,
            slow_metrics,
            encode_one,
            encode_attrs,
            wake: None,
            spill: None,
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

    /// In a forked child: the parent exports what was queued; new ids, new identity fields.
    fn after_fork(&mut self, base: &[u8]) {
        self.base = base.to_vec();
        self.buf = Vec::with_capacity(1 << 16);
        self.held = Vec::new();
        self.events = 0;
        self.woken = false;
        self.ids = fresh_seed();
        self.in_coll = None;
        self.wake = None;
        self.spill = None;
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
            Some(a) if !a.is_none() && a.is_truthy()? => Some(a.clone().unbind()),
            _ => None,
        };
        let step = step.filter(|s| !s.is_none());
        let key = (name.as_ptr() as usize, cat.as_ptr() as usize);
        if step.is_none() && attrs.is_none() {
            if let Some(s) = slf.try_borrow()?.spans.get(&key) {
                return Ok(s.clone_ref(py));
            }
        }
        let named = match (json_of(name), json_of(cat)) {
            (Some(n), Some(c)) => {
                let mut v = Vec::with_capacity(n.len() + c.len() + 16);
                v.extend_from_slice(b",\"name\":");
                v.extend_from_slice(&n);
                v.extend_from_slice(b",\"cat\":");
                v.extend_from_slice(&c);
                Some(v)
            }
            _ => None,
        };
        let is_step = cat.cast_exact::<PyString>().map(|c| c.to_str().map(|s| s == "step").unwrap_or(false)).unwrap_or(false);
        let (int_step, odd_step) = match step {
            None => (None, None),
            Some(s) => match exact_i64(s) {
                Some(i) => (Some(i), None),
                None => (None, Some(s.clone().unbind())),
            },
        };
        let cacheable = step.is_none() && attrs.is_none();
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
            if me.spans.len() < 4096 {
                me.spans.insert(key, span.clone_ref(py));
            }
        }
        Ok(span)
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
        self.events
    }

    /// The hot path of every logging call: the record's fields, formatted later by the drain.
    #[pyo3(signature = (record, progress=true))]
    fn log_record(slf: &Bound<'_, Self>, record: &Bound<'_, PyAny>, progress: bool) -> PyResult<()> {
        let py = slf.py();
        let name = record.getattr(intern!(py, "name"))?;
        if let Ok(n) = name.cast::<PyString>() {
            if n.to_str().map(|s| s.starts_with("jobtrace.export")).unwrap_or(false) {
                return Ok(()); // the exporter's own warnings must not loop back into its queue
            }
        }
        let args = record.getattr(intern!(py, "args"))?;
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
        let exc_info = record.getattr(intern!(py, "exc_info"))?;
        let exc_text = record.getattr(intern!(py, "exc_text"))?;
        if (!exc_info.is_none() && exc_info.is_truthy()?) || (!exc_text.is_none() && exc_text.is_truthy()?) {
            return slow(slf, record, progress); // rare: an exception's text
        }
        let created = record.getattr(intern!(py, "created"))?;
        let Some(created) = created.cast_exact::<PyFloat>().ok().map(|f| f.value()) else {
            return slow(slf, record, progress);
        };
        let level = record.getattr(intern!(py, "levelname"))?.unbind();
        let msg = record.getattr(intern!(py, "msg"))?.unbind();
        let s = {
            let mut me = slf.try_borrow_mut()?;
            let main = thread_ident() == me.main_ident;
            if main && progress {
                me.last_progress_ns = now_ns();
            }
            let sid = me.top_id();
            let step = me.step;
            me.hold(Held::Log { created, level, logger: name.unbind(), msg, args, exc: None, sid, step })
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
        let args = if args.is_none() || !args.is_truthy()? { None } else { Some(args.clone().unbind()) };
        let exc = if exc.is_none() || !exc.is_truthy()? { None } else { Some(exc.clone().unbind()) };
        let s = slf.try_borrow_mut()?.hold(Held::Log {
            created: created_f,
            level: level.clone().unbind(),
            logger: logger.clone().unbind(),
            msg: msg.clone().unbind(),
            args,
            exc,
            sid,
            step,
        });
        signal(slf, s)
    }

    /// `log_metrics`: plain numbers (and CPU tensors, read now) written here; anything else by Python.
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
        let mut m = Vec::with_capacity(64);
        m.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            let Some(key) = json_of(&k) else { return slow() };
            if i > 0 {
                m.push(b',');
            }
            m.extend_from_slice(&key);
            m.push(b':');
            if push_number(&mut m, &v) {
                continue;
            }
            // A CPU tensor's value is read now, as the Python recorder does (see its `metrics`).
            let cpu = v.getattr(intern!(py, "is_cpu")).map(|c| c.is_truthy().unwrap_or(false)).unwrap_or(false);
            if !cpu {
                return slow();
            }
            match v.call_method0(intern!(py, "item")) {
                Ok(x) if push_number(&mut m, &x) => {}
                _ => return slow(),
            }
        }
        m.push(b'}');
        let s = {
            let mut me = slf.try_borrow_mut()?;
            let ts = now_ns();
            let sid = me.top_id();
            let step = step.or(me.step);
            me.metric_line(ts, sid, &m, step);
            me.note_event()
        };
        signal(slf, s)
    }

    /// Queue an item in `_recorder.py`'s layout: spans and plain metric points are written
    /// here, log records held for the drain, anything else encoded by Python at the drain.
    fn emit(slf: &Bound<'_, Self>, item: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let Ok(t) = item.cast_exact::<PyTuple>() else { return hold_item(slf, item.clone()) };
        let tag = t.get_item(0).ok().and_then(|x| exact_i64(&x));
        match (tag, t.len()) {
            (Some(SPAN), 9) => {
                let f = |i: usize| t.get_item(i);
                let (sid, parent, start, end, step) = (f(1)?, f(2)?, f(5)?, f(6)?, f(7)?);
                let attrs = f(8)?;
                let parts = (exact_u64(&sid), opt_u64(&parent), json_of(&f(3)?), json_of(&f(4)?), exact_i64(&start),
                             exact_i64(&end), opt_i64(&step));
                if let (Some(sid), Some(parent), Some(n), Some(c), Some(start), Some(end), Some(step)) = parts {
                    let a = if attrs.is_none() || !attrs.is_truthy()? {
                        None
                    } else {
                        let enc = slf.try_borrow()?.encode_attrs.clone_ref(py);
                        match enc.call1(py, (&attrs,)).and_then(|b| b.extract::<Vec<u8>>(py)) {
                            Ok(b) => Some(b),
                            Err(_) => return hold_item(slf, item.clone()),
                        }
                    };
                    let mut named = Vec::with_capacity(n.len() + c.len() + 16);
                    named.extend_from_slice(b",\"name\":");
                    named.extend_from_slice(&n);
                    named.extend_from_slice(b",\"cat\":");
                    named.extend_from_slice(&c);
                    let s = {
                        let mut me = slf.try_borrow_mut()?;
                        match &a {
                            Some(a) => me.span_line(sid, parent, &named, start, end, step, &[a]),
                            None => me.span_line(sid, parent, &named, start, end, step, &[]),
                        }
                        me.note_event()
                    };
                    return signal(slf, s);
                }
                hold_item(slf, item.clone())
            }
            (Some(METRIC), 5) => {
                let (ts, step, values, sid) = (t.get_item(1)?, t.get_item(2)?, t.get_item(3)?, t.get_item(4)?);
                if let (Some(ts), Some(step), Some(sid), Ok(d)) = (exact_i64(&ts), opt_i64(&step), opt_u64(&sid), values.cast::<PyDict>()) {
                    let mut m = vec![b'{'];
                    let mut plain = true;
                    for (i, (k, v)) in d.iter().enumerate() {
                        let Some(key) = json_of(&k) else { plain = false; break };
                        if i > 0 {
                            m.push(b',');
                        }
                        m.extend_from_slice(&key);
                        m.push(b':');
                        if !push_number(&mut m, &v) {
                            plain = false;
                            break;
                        }
                    }
                    if plain {
                        m.push(b'}');
                        let s = {
                            let mut me = slf.try_borrow_mut()?;
                            me.metric_line(ts, sid, &m, step);
                            me.note_event()
                        };
                        return signal(slf, s);
                    }
                }
                hold_item(slf, item.clone())
            }
            (Some(LOG), 9) => {
                let f = |i: usize| t.get_item(i);
                let (created, sid, step) = (f(1)?, f(7)?, f(8)?);
                match (created.cast_exact::<PyFloat>().ok().map(|c| c.value()), opt_u64(&sid), opt_i64(&step)) {
                    (Some(created), Some(sid), Some(step)) => {
                        let (args, exc) = (f(5)?, f(6)?);
                        let held = Held::Log {
                            created,
                            level: f(2)?.unbind(),
                            logger: f(3)?.unbind(),
                            msg: f(4)?.unbind(),
                            args: if args.is_none() || !args.is_truthy()? { None } else { Some(args.unbind()) },
                            exc: if exc.is_none() || !exc.is_truthy()? { None } else { Some(exc.unbind()) },
                            sid,
                            step,
                        };
                        let s = slf.try_borrow_mut()?.hold(held);
                        signal(slf, s)
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
        let mut named = b",\"name\":".to_vec();
        let op_json = json_of(op.as_any()).unwrap_or_else(|| b"\"?\"".to_vec());
        named.extend_from_slice(&op_json);
        named.extend_from_slice(b",\"cat\":\"collective\"");
        Ok(Collective {
            core: slf.clone().unbind(),
            fn_,
            op: op.clone().unbind(),
            op_json,
            named,
            describe,
            group_type,
            payload_bytes,
        })
    }

    /// Everything queued, as event lines: `(bytes, lines, lines that could not be encoded)`.
    /// Runs on the export thread.
    fn drain(slf: &Bound<'_, Self>) -> PyResult<(Py<PyBytes>, usize, usize)> {
        let py = slf.py();
        let (buf, held, n, mut strings, base, encode_one) = {
            let mut me = slf.try_borrow_mut()?;
            me.woken = false;
            let cap = me.buf.capacity().min(1 << 22);
            let buf = std::mem::replace(&mut me.buf, Vec::with_capacity(cap));
            (buf, take(&mut me.held), take(&mut me.events), take(&mut me.strings), me.base.clone(), me.encode_one.clone_ref(py))
        };
        if held.is_empty() {
            slf.try_borrow_mut()?.strings = strings;
            return Ok((PyBytes::new(py, &buf).unbind(), n, 0));
        }
        let mut out = Vec::with_capacity(buf.len() + held.len() * 320);
        let mut prev = 0;
        let mut errors = 0;
        for (at, h) in held {
            out.extend_from_slice(&buf[prev..at]);
            prev = at;
            let item = match h {
                Held::Log { created, level, logger, msg, args, exc, sid, step } => {
                    if log_line(py, &mut out, &mut strings, &base, created, &level, &logger, &msg, &args, &exc, sid, step) {
                        continue;
                    }
                    PyTuple::new(py, [LOG.into_pyobject(py)?.into_any(), created.into_pyobject(py)?.into_any(), level.into_bound(py),
                        logger.into_bound(py), msg.into_bound(py),
                        args.map(|a| a.into_bound(py)).unwrap_or_else(|| py.None().into_bound(py)),
                        exc.map(|a| a.into_bound(py)).unwrap_or_else(|| py.None().into_bound(py)),
                        sid.into_pyobject(py)?.into_any(), step.into_pyobject(py)?.into_any()])?.into_any()
                }
                Held::Item(it) => it.into_bound(py),
            };
            match encode_one.call1(py, (item,)).and_then(|b| b.extract::<Vec<u8>>(py)) {
                Ok(line) => out.extend_from_slice(&line),
                Err(_) => errors += 1,
            }
        }
        out.extend_from_slice(&buf[prev..]);
        slf.try_borrow_mut()?.strings = strings;
        Ok((PyBytes::new(py, &out).unbind(), n - errors, errors))
    }
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
    let mut cached = |v: &Py<PyAny>| -> Option<Vec<u8>> {
        let s = v.bind(py).cast_exact::<PyString>().ok()?.to_str().ok()?;
        if let Some(j) = strings.get(s) {
            return Some(j.clone());
        }
        let mut j = Vec::with_capacity(s.len() + 2);
        json_str(&mut j, s.as_bytes());
        if strings.len() < 4096 {
            strings.insert(s.to_owned(), j.clone());
        }
        Some(j)
    };
    let (Some(lv), Some(lg)) = (cached(level), cached(logger)) else { return false };
    out.extend_from_slice(b"{\"ts\":");
    push_int(out, (created * 1e9) as i64);
    out.extend_from_slice(b",\"kind\":\"log\",");
    out.extend_from_slice(base);
    if let Some(s) = sid {
        out.extend_from_slice(b",\"span_id\":\"");
        push_hex16(out, s);
        out.push(b'"');
    }
    out.extend_from_slice(b",\"level\":");
    out.extend_from_slice(&lv);
    out.extend_from_slice(b",\"logger\":");
    out.extend_from_slice(&lg);
    out.extend_from_slice(b",\"msg\":");
    json_str(out, text.as_bytes());
    if let Some(e) = exc_text {
        out.extend_from_slice(b",\"exc\":");
        json_str(out, e.as_bytes());
    }
    if let Some(s) = step {
        out.extend_from_slice(b",\"step\":");
        push_int(out, s);
    }
    out.extend_from_slice(b"}\n");
    true
}

fn slow(rec: &Bound<'_, Recorder>, record: &Bound<'_, PyAny>, progress: bool) -> PyResult<()> {
    let f = rec.try_borrow()?.slow_log.clone_ref(rec.py());
    f.call1(rec.py(), (record, progress))?;
    Ok(())
}

/// `with rec.span(...)`: enter pushes a frame on the calling thread's stack, exit writes the line.
#[pyclass(frozen, module = "jobtrace_native")]
pub struct Span {
    core: Py<Recorder>,
    #[pyo3(get)]
    name: Py<PyAny>,
    #[pyo3(get)]
    cat: Py<PyAny>,
    /// `,"name":…,"cat":…`; None when either is not valid text (the Python encoder writes it).
    named: Option<Vec<u8>>,
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
        // Attributes with an error: a dict as the Python recorder builds it, encoded before borrowing.
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
        let encoded: Option<Vec<u8>> = match &attrs {
            None => None,
            Some(a) => {
                let enc = core.try_borrow()?.encode_attrs.clone_ref(py);
                enc.call1(py, (a,)).and_then(|b| b.extract::<Vec<u8>>(py)).ok()
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
            let s = if native {
                let named = this.named.as_deref().unwrap_or_default();
                match &encoded {
                    Some(a) => me.span_line(frame.id, frame.parent, named, frame.start, end, frame.step, &[a]),
                    None => me.span_line(frame.id, frame.parent, named, frame.start, end, frame.step, &[]),
                }
                me.note_event()
            } else {
                Signal::None
            };
            let hooks = if this.is_step { Some(me.hooks.clone_ref(py)) } else { None };
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
        } else {
            signal(core, s)?;
        }
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
    op_json: Vec<u8>,
    named: Vec<u8>,
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
            let name_json = json_of(&name);
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
        let error_json = error.as_ref().map(json_of);
        let s = {
            let mut me = core.try_borrow_mut()?;
            let me = &mut *me;
            me.in_coll = None;
            me.last_progress_ns = t1;
            let g = &me.groups[&key];
            match (&g.name_json, &error_json) {
                (Some(gj), None | Some(Some(_))) => {
                    let mut a = Vec::with_capacity(128);
                    a.extend_from_slice(b"{\"op\":");
                    a.extend_from_slice(&self.op_json);
                    a.extend_from_slice(b",\"group\":");
                    a.extend_from_slice(gj);
                    a.extend_from_slice(b",\"group_size\":");
                    push_int(&mut a, g.size);
                    a.extend_from_slice(b",\"seq\":");
                    push_int(&mut a, seq);
                    a.extend_from_slice(b",\"bytes\":");
                    push_int(&mut a, payload);
                    if is_async {
                        a.extend_from_slice(b",\"async\":true");
                    }
                    if let Some(Some(e)) = &error_json {
                        a.extend_from_slice(b",\"error\":");
                        a.extend_from_slice(e);
                    }
                    a.push(b'}');
                    me.span_line(sid, parent, &self.named, t0, t1, step, &[&a]);
                    Some(me.note_event())
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
