//! The recorder's queue: the events it holds until the export thread's drain (`Ev`), the buffers kept from
//! one drain to the next, what queueing an event asks of its caller (`Signal`), and `emit`, which queues an
//! item in `_recorder.py`'s layout.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyTuple};

use super::values::{exact_i64, exact_u64, given, key_json, named_of, number, opt_i64, opt_u64};
use super::Recorder;
use crate::line_writer::{Chunk, Num};

// Item tags of `_recorder.py`.
pub(super) const SPAN: i64 = 0;
pub(super) const LOG: i64 = 1;
const METRIC: i64 = 2;

/// A queued event. Spans, collectives and metric points are written by the drain without Python;
/// `Log` (formatted with Python's `%` first) and `Item` (the Python encoder's) need the GIL.
pub(super) enum Ev {
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

/// What an event's queueing asks of its caller once the recorder is no longer borrowed.
#[derive(PartialEq)]
pub(super) enum Signal {
    None,
    /// A batch is waiting: wake the export thread (once per batch).
    Wake,
    /// The queue is full (the sinks cannot keep up): write it to the spill file now.
    Spill,
}

/// The queue's and the drain's buffers, kept from one drain to the next: new ones the size of a
/// busy second (megabytes at thousands of events a second) cost page faults each time, the queue's
/// on the training thread that fills it.
#[derive(Default)]
pub(super) struct Buffers {
    pub(super) evs: Vec<Ev>,
    pub(super) mvals: Vec<(Chunk, Num)>,
    pub(super) out: Vec<u8>,
    pub(super) full: Vec<u8>,
}

impl Buffers {
    /// Emptied, keeping their room up to what a busy second needs (a spilled queue's is let go).
    pub(super) fn recycle(mut self) -> Buffers {
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

impl Recorder {
    pub(super) fn push(&mut self, ev: Ev) -> Signal {
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

    pub(super) fn push_metric(&mut self, ts: i64, sid: Option<u64>, step: Option<i64>, values: impl Iterator<Item = (Chunk, Num)>) -> Signal {
        let from = self.mvals.len() as u32;
        self.mvals.extend(values);
        let to = self.mvals.len() as u32;
        self.push(Ev::Metric { ts, sid, step, from, to })
    }
}

/// After queueing: wake the export thread, or spill the queue, with the recorder no longer borrowed.
pub(super) fn signal(rec: &Bound<'_, Recorder>, s: Signal) -> PyResult<()> {
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

/// Queue `ev`, then do what that asks (see `signal`).
pub(super) fn push_signal(rec: &Bound<'_, Recorder>, ev: Ev) -> PyResult<()> {
    let s = rec.try_borrow_mut()?.push(ev);
    signal(rec, s)
}

/// Queue an item for the Python encoder, written by the drain in its place.
pub(super) fn hold_item(rec: &Bound<'_, Recorder>, item: Bound<'_, PyAny>) -> PyResult<()> {
    push_signal(rec, Ev::Item(item.unbind()))
}

/// Queue an item in `_recorder.py`'s layout: spans and plain metric points are written by the
/// drain, log records formatted there, anything else encoded by Python at the drain.
pub(super) fn emit(slf: &Bound<'_, Recorder>, item: &Bound<'_, PyAny>) -> PyResult<()> {
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
