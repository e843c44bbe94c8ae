//! Which Python values the compiled path takes as they are (exact ints, floats, valid text), read at the call;
//! anything else goes the Python recorder's way.

use std::sync::atomic::{AtomicU8, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use super::{Recorder, CACHE_MAX};
use crate::line_writer::{decimal_float, json_str, span_names, Chunk, Num};

/// An exact `int` that fits, as Python's fast path takes it (`type(x) is int`).
pub(super) fn exact_i64(v: &Bound<'_, PyAny>) -> Option<i64> {
    if v.is_exact_instance_of::<PyInt>() {
        v.extract().ok()
    } else {
        None
    }
}

/// An exact `int` that fits in 64 unsigned bits (a span id).
pub(super) fn exact_u64(v: &Bound<'_, PyAny>) -> Option<u64> {
    if v.is_exact_instance_of::<PyInt>() {
        v.extract().ok()
    } else {
        None
    }
}

/// `None` → `Some(None)`; an exact int → `Some(Some(i))`; anything else → `None` (Python's path).
pub(super) fn opt_i64(v: &Bound<'_, PyAny>) -> Option<Option<i64>> {
    if v.is_none() {
        Some(None)
    } else {
        exact_i64(v).map(Some)
    }
}

/// `opt_i64` of an unsigned id.
pub(super) fn opt_u64(v: &Bound<'_, PyAny>) -> Option<Option<u64>> {
    if v.is_none() {
        Some(None)
    } else {
        exact_u64(v).map(Some)
    }
}

/// `v` where Python would take it as given (`if v:`), None where it is None or empty.
pub(super) fn given(v: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    Ok(if v.is_none() || !v.is_truthy()? { None } else { Some(v.clone().unbind()) })
}

/// Valid UTF-8 text of an exact `str`, JSON-encoded; `None` for anything else (Python's path).
pub(super) fn json_of(v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let s = v.cast_exact::<PyString>().ok()?.to_str().ok()?;
    let mut out = Vec::with_capacity(s.len() + 2);
    json_str(&mut out, s.as_bytes());
    Some(out)
}

/// How the installed orjson writes an exponent: 0 unknown (such floats go to Python), 1 `1e16`, 2 `1e+16`.
pub(super) static SCI_STYLE: AtomicU8 = AtomicU8::new(0);

/// `push_float`'s `sci_plus` for the installed orjson, where it is known.
pub(super) fn sci_plus() -> Option<bool> {
    match SCI_STYLE.load(Ordering::Relaxed) {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}

/// A metric value as `_recorder._number` reads it, when it is a plain number the drain can write.
pub(super) fn number(v: &Bound<'_, PyAny>) -> Option<Num> {
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

/// `,"name":…,"cat":…` of a span; None when either is not valid text.
pub(super) fn named_of(name: &Bound<'_, PyAny>, cat: &Bound<'_, PyAny>) -> Option<Chunk> {
    Some(span_names(&json_of(name)?, &json_of(cat)?))
}

/// A metric key's JSON, cached by key object.
pub(super) fn key_json(rec: &Bound<'_, Recorder>, k: &Bound<'_, PyAny>) -> PyResult<Option<Chunk>> {
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
