//! A log record's hot path: the fields of a common record queued as they are (formatted by the drain), any
//! other record handed to the Python recorder (`slow_log`) at the call.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

use super::queue::{signal, Ev};
use super::{now_ns, thread_ident, Recorder};

/// The hot path of every logging call: the record's fields, formatted by the drain.
pub(super) fn log_record<'py>(slf: &Bound<'py, Recorder>, record: &Bound<'py, PyAny>, progress: bool) -> PyResult<()> {
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
        let (sid, step) = log_place(&mut me, progress);
        me.push(Ev::Log { created, level: level.unbind(), logger: name.unbind(), msg: msg.unbind(), args, exc: None, sid, step })
    };
    signal(slf, s)
}

/// Where a log record of the calling thread goes: its span (the innermost, else the root) and the step; a
/// record that counts as progress (`progress`) on the main thread marks the time (the heartbeat's stall clock).
pub(super) fn log_place(me: &mut Recorder, progress: bool) -> (Option<u64>, Option<i64>) {
    if progress && thread_ident() == me.main_ident {
        me.last_progress_ns = now_ns();
    }
    (me.top_id(), me.step)
}

/// The Python recorder's path for a record the compiled one does not take as it is.
fn slow(rec: &Bound<'_, Recorder>, record: &Bound<'_, PyAny>, progress: bool) -> PyResult<()> {
    let f = rec.try_borrow()?.slow_log.clone_ref(rec.py());
    f.call1(rec.py(), (record, progress))?;
    Ok(())
}
