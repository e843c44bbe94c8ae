//! Identity-first event lines, `{<identity>,"kind":…,…,"ts":…}\n`: a parser's event dict as the ingest
//! engine's `_write` encodes it. Its keys keep the parser's order; `_write` puts the identity first and adds
//! `ts` (and a span's `start`, where the parser left times relative to the line's) at the end, then
//! `"est":true` for an event whose time was estimated (a line that waited for the stream's next time).
//!
//! `open` is `{` and the identity fields and `,` (`dict_open`); `ts` already has the stream's clock offset.

use super::json::{int_field, json_str, plain_str, push_int, str_field};
use super::metrics::{metric_map, MetricKey, Num};

/// `{` + the identity fields + `,`: what `_write` puts before an event dict's own keys.
pub(crate) fn dict_open(ident: &[u8]) -> Vec<u8> {
    let mut open = Vec::with_capacity(ident.len() + 2);
    open.push(b'{');
    open.extend_from_slice(ident);
    open.push(b',');
    open
}

/// `,"ts":…` (then `,"est":true` for an estimated time) and the line's end.
fn close(buf: &mut Vec<u8>, ts: i64, est: bool) {
    int_field(buf, key!("ts"), ts);
    buf.extend_from_slice(if est { b",\"est\":true}\n" } else { b"}\n" });
}

/// A log event: `{"kind":"log","level":…,"msg":…[,"logger":…]}` (a parser's line, `_parse`'s line itself,
/// a `print` that waited for a time). `level` is one of the level names (ASCII).
pub(crate) fn log_event(buf: &mut Vec<u8>, open: &[u8], level: &str, msg: &[u8], logger: Option<&[u8]>, ts: i64, est: bool) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"");
    buf.extend_from_slice(level.as_bytes());
    buf.extend_from_slice(b"\",\"msg\":");
    json_str(buf, msg);
    if let Some(l) = logger {
        str_field(buf, key!("logger"), l);
    }
    close(buf, ts, est);
}

/// What an NCCL debug line's event says besides its level and message (`torch_distributed.py`'s `_nccl`).
pub(crate) struct NcclFields<'a> {
    pub host: &'a str,
    pub pid: i64,
    pub tid: i64,
    pub dev: i64,
    /// `file:line`, where the line names its source.
    pub src: Option<&'a str>,
}

/// An NCCL line's log event, which always waits for a time (NCCL lines have none):
/// `{"kind":"log","level","logger":"nccl","msg","attrs":{"nccl_host","nccl_pid","tid","cuda_dev"[,"src"]}}`.
pub(crate) fn nccl_event(buf: &mut Vec<u8>, open: &[u8], level: &str, msg: &str, a: &NcclFields<'_>, ts: i64) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"log\",\"level\":\"");
    buf.extend_from_slice(level.as_bytes());
    buf.extend_from_slice(b"\",\"logger\":\"nccl\",\"msg\":");
    json_str(buf, msg.as_bytes());
    buf.extend_from_slice(b",\"attrs\":{\"nccl_host\":");
    json_str(buf, a.host.as_bytes());
    int_field(buf, key!("nccl_pid"), a.pid);
    int_field(buf, key!("tid"), a.tid);
    int_field(buf, key!("cuda_dev"), a.dev);
    if let Some(src) = a.src {
        str_field(buf, key!("src"), src.as_bytes());
    }
    buf.push(b'}');
    close(buf, ts, true);
}

/// `{"kind":"metric","step":…,"metrics":{…}}`: a step's metrics, the step first (the generic step parser,
/// Megatron-LM's iterations, DeepSpeed's progress, a tqdm bar's progress). The values are ones the lane
/// writes (`lane_writes`).
pub(crate) fn step_metric<K: MetricKey, V: Copy + Into<Num>>(
    buf: &mut Vec<u8>,
    open: &[u8],
    step: i64,
    m: &[(K, V)],
    ts: i64,
    est: bool,
) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"metric\",\"step\":");
    push_int(buf, step);
    buf.extend_from_slice(b",\"metrics\":");
    metric_map(buf, m, None);
    close(buf, ts, est);
}

/// `{"kind":"metric","metrics":{…}[,"attrs":{"step_estimated":true}][,"step":…]}`: metrics whose step, where
/// they have one, is known after them (DeepSpeed's timers, a Hugging Face Trainer dict; `estimated` marks a
/// step counted from the dicts so far). The values are ones the lane writes (`lane_writes`).
pub(crate) fn metric_event<K: MetricKey, V: Copy + Into<Num>>(
    buf: &mut Vec<u8>,
    open: &[u8],
    m: &[(K, V)],
    estimated: bool,
    step: Option<i64>,
    ts: i64,
    est: bool,
) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"metric\",\"metrics\":");
    metric_map(buf, m, None);
    if estimated {
        buf.extend_from_slice(b",\"attrs\":{\"step_estimated\":true}");
    }
    if let Some(step) = step {
        int_field(buf, key!("step"), step);
    }
    close(buf, ts, est);
}

/// A step span of `_util.step_span`: `dur` long, ending at `end` (clock offset applied), with its `source`.
pub(crate) struct StepSpan<'a> {
    pub step: i64,
    pub dur: i64,
    pub id: &'a str,
    pub source: &'a str,
    pub end: i64,
}

/// `{"kind":"span","cat":"step","name":"step","step","ts","start","dur","span_id","attrs":{"source"}}` as
/// `_util.step_span` orders it (DeepSpeed's), or with `times_last` where the parser took its `ts` and `start`
/// out for `_write` to add at the end (the generic step parser's, Megatron-LM's, a tqdm bar's).
pub(crate) fn step_span(buf: &mut Vec<u8>, open: &[u8], s: &StepSpan<'_>, times_last: bool, est: bool) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":\"step\",\"name\":\"step\",\"step\":");
    push_int(buf, s.step);
    if !times_last {
        int_field(buf, key!("ts"), s.end);
        int_field(buf, key!("start"), s.end - s.dur);
    }
    int_field(buf, key!("dur"), s.dur);
    buf.extend_from_slice(b",\"span_id\":\"");
    buf.extend_from_slice(s.id.as_bytes());
    buf.extend_from_slice(b"\",\"attrs\":{\"source\":\"");
    buf.extend_from_slice(s.source.as_bytes());
    buf.extend_from_slice(b"\"}");
    if times_last {
        int_field(buf, key!("start"), s.end - s.dur);
        close(buf, s.end, est);
    } else {
        buf.extend_from_slice(if est { b",\"est\":true}\n" } else { b"}\n" });
    }
}

/// A phase or collective span of `_util.layout_spans`: `dur` long from `start` (clock offset applied),
/// inside the step span `parent`; a collective's attributes name its op and the parser (`source`).
pub(crate) struct LayoutSpan<'a> {
    /// `"phase"` or `"collective"`: a fixed name, written without the escaping pass.
    pub cat: &'static str,
    pub name: &'a str,
    pub step: i64,
    pub start: i64,
    pub dur: i64,
    pub id: &'a str,
    /// The step span's id: text that needs no escape (`is_plain`), written as it is: the lane's own ids
    /// (`new_span_id`'s hex digits), or one from a parser's state that the reader checked.
    pub parent: Option<&'a str>,
    /// `(op, source)` of a collective: `"attrs":{"op","group":"default","seq":step,"source"}`.
    pub collective: Option<(&'a str, &'a str)>,
}

/// `{"kind":"span","cat","name","step","start","dur","ts","span_id"[,"parent_id"][,"attrs"]}` as
/// `layout_spans` orders it (DeepSpeed's timers), or with `times_last` where the parser made `ts` and `start`
/// relative to the line's time (`dt`, `start_dt`) and `_write` adds them back at the end (the generic step
/// parser's phases).
pub(crate) fn layout_span(buf: &mut Vec<u8>, open: &[u8], s: &LayoutSpan<'_>, times_last: bool) {
    buf.extend_from_slice(open);
    buf.extend_from_slice(b"\"kind\":\"span\",\"cat\":");
    plain_str(buf, s.cat.as_bytes());
    str_field(buf, key!("name"), s.name.as_bytes());
    int_field(buf, key!("step"), s.step);
    if !times_last {
        int_field(buf, key!("start"), s.start);
    }
    int_field(buf, key!("dur"), s.dur);
    if !times_last {
        int_field(buf, key!("ts"), s.start + s.dur);
    }
    buf.extend_from_slice(b",\"span_id\":\"");
    buf.extend_from_slice(s.id.as_bytes());
    buf.push(b'"');
    if let Some(p) = s.parent {
        buf.extend_from_slice(key!("parent_id"));
        plain_str(buf, p.as_bytes());
    }
    if let Some((op, source)) = s.collective {
        buf.extend_from_slice(b",\"attrs\":{\"op\":");
        json_str(buf, op.as_bytes());
        buf.extend_from_slice(b",\"group\":\"default\",\"seq\":");
        push_int(buf, s.step);
        buf.extend_from_slice(b",\"source\":\"");
        buf.extend_from_slice(source.as_bytes());
        buf.extend_from_slice(b"\"}");
    }
    if times_last {
        int_field(buf, key!("start"), s.start);
        close(buf, s.start + s.dur, false);
    } else {
        buf.extend_from_slice(b"}\n");
    }
}
