//! `with rec.span(...)`: the `Span` context manager, whose enter pushes a frame on the calling thread's
//! stack and whose exit queues the span (and, at a step's end, host RSS and the step hooks).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::queue::{hold_item, signal, Ev, Signal, SPAN};
use super::{now_ns, Recorder};
use crate::line_writer::{Chunk, Num};

/// An entered span on a thread's stack.
pub(super) struct Frame {
    pub(super) span: Py<Span>,
    pub(super) id: u64,
    pub(super) parent: Option<u64>,
    pub(super) start: i64,
    pub(super) step: Option<i64>,
}

/// The span an entry point of the package makes (`make`, with `Recorder::span`), or the null span once the
/// recorder is retired.
pub(super) fn entry_span(rec: &Bound<'_, Recorder>, make: impl FnOnce() -> PyResult<Py<Span>>) -> PyResult<Py<PyAny>> {
    if let Some(null) = &rec.try_borrow()?.retired {
        return Ok(null.clone_ref(rec.py()));
    }
    Ok(make()?.into_any())
}

/// `with rec.span(...)`: enter pushes a frame on the calling thread's stack, exit queues the span.
#[pyclass(frozen, module = "jobtrace_native")]
pub struct Span {
    pub(super) core: Py<Recorder>,
    #[pyo3(get)]
    pub(super) name: Py<PyAny>,
    #[pyo3(get)]
    pub(super) cat: Py<PyAny>,
    /// `,"name":…,"cat":…`; None when either is not valid text (the Python encoder writes it).
    pub(super) named: Option<Chunk>,
    pub(super) is_step: bool,
    pub(super) step: Option<i64>,
    /// A step that is not an int: its span is written by the Python encoder, and not carried to phases.
    pub(super) odd_step: Option<Py<PyAny>>,
    pub(super) attrs: Option<Py<PyAny>>,
    /// The id of the frame this object last entered (`with rec.span(...) as s: s.span_id`). One object
    /// serves every use of a name without a step or attributes, so it is the latest such span's id.
    pub(super) last_id: AtomicU64,
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
