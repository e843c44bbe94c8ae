//! The event-line writer: the bytes of the event lines the compiled parts write, byte for byte as the
//! Python code writes the same event, and the JSON in them (`json`: strings, ints, floats as orjson writes
//! them; `metrics`: metric maps, NaN and the infinities as the strings the analysis reads).
//!
//! `time_first` writes the lines `{"ts":…,"kind":…,<identity>,…}\n`: the byte templates of the ingest
//! engine's `_plain_line` and of the recorder's encoders (`_recorder.py`'s `_encode_log`, `_encode_span`,
//! `_encode_metric`). The identity fields (`"job":…,"v":1`) are written once per output by Python and passed
//! in as bytes (`ident`).

mod json;
mod metrics;
mod time_first;

pub(crate) use json::{decimal_float, json_float, json_str, push_int};
pub(crate) use metrics::{Chunk, Num};
pub(crate) use time_first::{collective_line, log_line, metric_line, span_line, CollectiveFields, LogLine, SpanPlace, Text};
