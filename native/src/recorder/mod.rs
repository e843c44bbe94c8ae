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
//!
//! Here: the `Recorder` and its entry points; `span` (the `Span` context manager and the frames it pushes),
//! `collective` (a wrapped `torch.distributed` call), `logs` (a log record's hot path), `values` (which
//! Python values the compiled path takes as they are), `queue` (the queued events and what queueing asks
//! of the caller), `drain` (the export thread's writing of the queue, with `crate::line_writer`), `rss`.

use std::mem::take;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustc_hash::FxHashMap as HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::line_writer::{Chunk, Num};

mod collective;
mod drain;
mod logs;
mod queue;
mod rss;
mod span;
mod values;

use collective::{Collective, Group, InCollective};
use queue::{hold_item, push_signal, signal, Buffers, Ev, LOG};
use rss::Rss;
use span::{entry_span, Frame, Span};
use values::{exact_i64, given, json_of, key_json, named_of, number, opt_i64, SCI_STYLE};

/// The wall clock in ns, as `time.time_ns()`.
fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// The calling thread's id, as `threading.get_ident()`.
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

/// A span's name and category objects (kept alive, so that their addresses are not reused) and their JSON.
type Named = (Py<PyAny>, Py<PyAny>, Chunk);

/// `Recorder.top`: the main thread's innermost span as `(name, cat, start_ns)`.
type TopSpan = (Py<PyAny>, Py<PyAny>, i64);

/// `Recorder.in_collective`: `(op, group, seq, t0_ns, bytes)` of the collective the rank is blocked in.
type Blocked = (Py<PyString>, Py<PyAny>, i64, i64, i64);

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
    names: HashMap<(usize, usize), Named>,
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

/// The most entries each of the recorder's caches keeps (span objects, names, keys, strings).
const CACHE_MAX: usize = 4096;

impl Recorder {
    /// A new span id.
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

    /// The calling thread's stack of entered spans (the main thread's is kept apart: most calls are there).
    fn stack(&mut self) -> &mut Vec<Frame> {
        let t = thread_ident();
        if t == self.main_ident {
            &mut self.main
        } else {
            self.others.entry(t).or_default()
        }
    }

    /// `stack`, where the calling thread has one.
    fn stack_ref(&self) -> Option<&Vec<Frame>> {
        let t = thread_ident();
        if t == self.main_ident {
            Some(&self.main)
        } else {
            self.others.get(&t)
        }
    }

    /// The calling thread's innermost span, else the root span: the parent of what it records now.
    fn top_id(&self) -> Option<u64> {
        self.stack_ref().and_then(|s| s.last()).map(|f| f.id).or(self.root_span_id)
    }
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
        let step = intern!(slf.py(), "step");
        entry_span(slf, || Self::span(slf, step, step, Some(i), attrs.map(Bound::as_any)))
    }

    /// `otel_instrumentation.phase(name, **attrs)` while this recorder traces.
    #[pyo3(signature = (name, **attrs))]
    fn phase(slf: &Bound<'_, Self>, name: &Bound<'_, PyAny>, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        entry_span(slf, || Self::span(slf, name, intern!(slf.py(), "phase"), None, attrs.map(Bound::as_any)))
    }

    /// `otel_instrumentation.span(name, **attrs)` while this recorder traces.
    #[pyo3(signature = (name, **attrs))]
    fn user_span(slf: &Bound<'_, Self>, name: &Bound<'_, PyAny>, attrs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        entry_span(slf, || Self::span(slf, name, intern!(slf.py(), "user"), None, attrs.map(Bound::as_any)))
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
    fn top(slf: &Bound<'_, Self>) -> PyResult<Option<TopSpan>> {
        let py = slf.py();
        let me = slf.try_borrow()?;
        Ok(me.main.last().map(|f| {
            let s = f.span.bind(py).get();
            (s.name.clone_ref(py), s.cat.clone_ref(py), f.start)
        }))
    }

    /// What the rank is blocked in: `(op, group, seq, t0_ns, bytes)` or None.
    #[getter]
    fn in_collective(slf: &Bound<'_, Self>) -> PyResult<Option<Blocked>> {
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
        logs::log_record(slf, record, progress)
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
        let (sid, step) = logs::log_place(&mut *slf.try_borrow_mut()?, progress);
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
        queue::emit(slf, item)
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
        drain::drain(slf)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Recorder>()?;
    m.add_class::<Span>()?;
    m.add_class::<Collective>()?;
    Ok(())
}
