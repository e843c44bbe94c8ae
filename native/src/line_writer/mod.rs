//! The event-line writer: every byte of an event line that the compiled parts write, the ingest lane's and
//! the recorder's alike, is written here, byte for byte as the Python code writes the same event.
//!
//! An event line comes in one of two shapes, after the two ways Python writes one:
//!
//! * time first, `{"ts":…,"kind":…,<identity>,…}` (`time_first`): the byte templates of the ingest engine's
//!   `_plain_line` and of the recorder's encoders (`_recorder.py`'s `_encode_log`, `_encode_span`,
//!   `_encode_metric`). A log line is one function for both: the lane's strict Python `logging` line and the
//!   recorder's log record differ only in the fields they have.
//! * identity first, `{<identity>,"kind":…,…,"ts":…}` (`event_dict`): an event dict of a parser as the ingest
//!   engine's `_write` encodes it, its keys in the parser's order (the lane only: the recorder has no dicts).
//!
//! Both shapes write their JSON values the same way (`json`: strings, ints, floats as orjson writes them) and
//! their metric maps the same way (`metrics`: NaN and the infinities as the strings the analysis reads).
//!
//! The identity fields (`"job":…,"v":1`) are written once per output by Python and passed in as bytes: `ident`
//! (the fields alone) for the time-first lines, `open` (`{` + fields + `,`, see `dict_open`) for the others.

/// `,"<name>":`, the key of a field that follows another, spelled once at compile time: the lines'
/// fields are written as `int_field(out, key!("step"), step)`, so a key cannot lose its quotes or comma.
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":").as_bytes()
    };
}

mod event_dict;
mod json;
mod metrics;
mod time_first;

pub(crate) use event_dict::{dict_open, layout_span, log_event, metric_event, nccl_event, step_metric, step_span};
pub(crate) use event_dict::{LayoutSpan, NcclFields, StepSpan};
pub(crate) use json::{decimal_float, is_plain, json_float, json_str};
pub(crate) use metrics::{lane_writes, Chunk, Num};
pub(crate) use time_first::{collective_line, log_line, metric_line, span_line, span_names};
pub(crate) use time_first::{CollectiveFields, LogLine, SpanPlace, Text};
