//! Reading the Python dicts the lane shares with the engine: the parsers' state of a stream, and the
//! event dicts of lines waiting for a time.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::GiveBack;

/// The keys of a dict, in order, as strings (`None` if one is not a string).
pub(super) fn keys_of(d: &Bound<'_, PyDict>) -> Option<Vec<String>> {
    d.keys().iter().map(|k| k.extract::<String>().ok()).collect()
}

/// `d[key]` as a `T`, where it is there and one.
pub(super) fn item<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> Option<T> {
    d.get_item(key).ok().flatten()?.extract::<T>().ok()
}

/// A float (or None) of a parser's state dict; anything else is given back.
pub(super) fn get_float(d: &Bound<'_, PyDict>, key: &str) -> Result<Option<f64>, GiveBack> {
    match d.get_item(key).map_err(|_| GiveBack)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => {
            if !v.is_instance_of::<pyo3::types::PyFloat>() {
                return Err(GiveBack);
            }
            v.extract::<f64>().map(Some).map_err(|_| GiveBack)
        }
    }
}

/// An int (or None) of a parser's state dict; anything else is given back.
pub(super) fn get_int(d: &Bound<'_, PyDict>, key: &str) -> Result<Option<i64>, GiveBack> {
    match d.get_item(key).map_err(|_| GiveBack)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => {
            if v.is_instance_of::<pyo3::types::PyBool>() {
                return Err(GiveBack);
            }
            v.extract::<i64>().map(Some).map_err(|_| GiveBack)
        }
    }
}
