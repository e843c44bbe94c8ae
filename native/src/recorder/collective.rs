//! A wrapped `torch.distributed` collective (`Recorder.wrap_collective`): the call recorded as a span of
//! category `collective`, with the group's name and size, its per-group sequence number and the bytes sent.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use super::queue::{hold_item, signal, Ev};
use super::values::{exact_i64, json_of};
use super::{now_ns, Recorder};
use crate::line_writer::Chunk;

/// A process group as the recorder knows it: its name (and its JSON), size and last sequence number.
pub(super) struct Group {
    pub(super) name: Py<PyAny>,
    /// None: a name that is not valid text (such collectives are written by the Python encoder).
    pub(super) name_json: Option<Chunk>,
    pub(super) size: i64,
    pub(super) seq: i64,
}

/// The collective the rank is in (`Recorder.in_collective`, for the heartbeat).
pub(super) struct InCollective {
    pub(super) op: Py<PyString>,
    pub(super) group: Py<PyAny>,
    pub(super) seq: i64,
    pub(super) t0: i64,
    pub(super) bytes: i64,
}

/// A `torch.distributed` collective, wrapped (`Recorder.wrap_collective`).
#[pyclass(frozen, dict, module = "jobtrace_native")]
pub struct Collective {
    pub(super) core: Py<Recorder>,
    pub(super) fn_: Py<PyAny>,
    pub(super) op: Py<PyString>,
    pub(super) op_json: Option<Chunk>,
    pub(super) describe: Py<PyAny>,
    pub(super) group_type: Py<PyAny>,
    pub(super) payload_bytes: Py<PyAny>,
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
            let g = group.clone().unwrap_or_else(|| py.None().into_bound(py));
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
