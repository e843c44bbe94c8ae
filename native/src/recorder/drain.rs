//! The export thread's drain: every queued event written as its line, in queue order. Spans, collectives and
//! metric points are written with the GIL released; log records (formatted with Python's `%` first) and the
//! items Python encodes are written into their places after, with it.

use std::mem::take;

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use super::queue::{Buffers, Ev, LOG};
use super::values::sci_plus;
use super::{Recorder, CACHE_MAX};
use crate::line_writer::{collective_line, json_str, log_line, metric_line, span_line};
use crate::line_writer::{Chunk, CollectiveFields, LogLine, Num, SpanPlace, Text};

/// Everything queued, as event lines: `(bytes, lines, events that could not be encoded)`.
/// Runs on the export thread: spans, collectives and metric points are written with the
/// GIL released, then the log records and Python's items with it.
pub(super) fn drain(slf: &Bound<'_, Recorder>) -> PyResult<(Py<PyBytes>, usize, usize)> {
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

/// The line of a span, a collective or a metric point, as the Python encoder writes it
/// (`_encode_span`, `_as_span`, `_encode_metric`); false for the events Python writes.
fn encode(out: &mut Vec<u8>, base: &[u8], ev: &Ev, mvals: &[(Chunk, Num)]) -> bool {
    match ev {
        Ev::Span { sid, parent, named, start, end, step, attrs } => {
            let at = SpanPlace { sid: *sid, parent: *parent, start: *start, end: *end, step: *step };
            span_line(out, base, &at, named, attrs.as_deref());
        }
        Ev::Coll { sid, parent, op, group, size, seq, bytes, start, end, step, is_async, error } => {
            let at = SpanPlace { sid: *sid, parent: *parent, start: *start, end: *end, step: *step };
            let c = CollectiveFields { op, group, size: *size, seq: *seq, bytes: *bytes, is_async: *is_async, error: error.as_deref() };
            collective_line(out, base, &at, &c);
        }
        Ev::Metric { ts, sid, step, from, to } => {
            metric_line(out, base, *ts, *sid, &mvals[*from as usize..*to as usize], *step, sci_plus());
        }
        Ev::Log { .. } | Ev::Item(_) => return false,
    }
    true
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
                if record_line(py, full, strings, base, *created, level, logger, msg, args, exc, *sid, *step) {
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
fn record_line(
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
    // as the Python encoder's cache: the JSON of a name seen before, else the name (the cache is full)
    fn name<'a>(py: Python<'a>, v: &'a Py<PyAny>, strings: &'a HashMap<String, Vec<u8>>) -> Text<'a> {
        let s = v.bind(py).cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok()).unwrap_or_default();
        match strings.get(s) {
            Some(j) => Text::Json(j),
            None => Text::Raw(s.as_bytes()),
        }
    }
    let line = LogLine {
        ts: (created * 1e9) as i64,
        span_id: sid,
        level: name(py, level, strings),
        logger: name(py, logger, strings),
        msg: text.as_bytes(),
        exc: exc_text.map(str::as_bytes),
        step,
    };
    log_line(out, base, &line);
    true
}
