//! Metric maps and values, as both the ingest engine (`metric_value`, then orjson) and the recorder
//! (`_encode_metric`) write them.

use std::sync::Arc;

use super::json::{decimal_float, json_str, push_float, push_int};

/// JSON text written once and shared by every line that repeats it (a recorder span's name and category,
/// a metric's key).
pub(crate) type Chunk = Arc<[u8]>;

/// A metric value: an int (the recorder's ints and bools), or a float.
#[derive(Clone, Copy)]
pub(crate) enum Num {
    F(f64),
    I(i64),
}

impl From<f64> for Num {
    fn from(x: f64) -> Num {
        Num::F(x)
    }
}

/// Whether the lane writes the metric value `x` exactly as orjson does (`push_metric_value` without
/// `sci_plus`): NaN and the infinities, and the finite floats in decimal notation. The lane checks this
/// where it reads a value, before a line changes any state; a line with another is Python's.
pub(crate) fn lane_writes(x: f64) -> bool {
    !x.is_finite() || decimal_float(x)
}

/// A metric value: an int; NaN and the infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`
/// (`metric_value`, `_number`); a finite float as `push_float` writes it, which writes nothing where its
/// notation is not known (`sci_plus` is `None`: callers check first, see `lane_writes`).
fn push_metric_value(out: &mut Vec<u8>, n: Num, sci_plus: Option<bool>) {
    match n {
        Num::I(i) => push_int(out, i),
        Num::F(x) if x.is_nan() => out.extend_from_slice(b"\"NaN\""),
        Num::F(x) if x.is_infinite() => out.extend_from_slice(if x > 0.0 { b"\"Infinity\"" } else { b"\"-Infinity\"" }),
        Num::F(x) => {
            push_float(out, x, sci_plus);
        }
    }
}

/// A metric map's key: text, escaped here (the lane's names), or its JSON written before (`Chunk`, the
/// recorder's cache).
pub(crate) trait MetricKey {
    fn write_key(&self, out: &mut Vec<u8>);
}

impl MetricKey for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        json_str(out, self.as_bytes());
    }
}

impl MetricKey for &str {
    fn write_key(&self, out: &mut Vec<u8>) {
        json_str(out, self.as_bytes());
    }
}

impl MetricKey for Chunk {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

/// `{key:value,…}` in the order given (a name met twice is the caller's to merge, as a dict does).
pub(crate) fn metric_map<K: MetricKey, V: Copy + Into<Num>>(out: &mut Vec<u8>, m: &[(K, V)], sci_plus: Option<bool>) {
    out.push(b'{');
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        k.write_key(out);
        out.push(b':');
        push_metric_value(out, (*v).into(), sci_plus);
    }
    out.push(b'}');
}
