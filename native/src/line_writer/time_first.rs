//! Time-first event lines, `{"ts":…,"kind":…,<identity>,…}\n`: the byte templates of the ingest engine's
//! `_plain_line` and of the recorder's `_encode_log`, `_encode_span` and `_encode_metric`.

use super::json::{int_field, json_str, push_hex16, push_int, raw_field, str_field};
use super::metrics::{metric_map, Chunk, Num};

/// `{"ts":…,"kind":"…",` and the identity fields: how every time-first line begins.
fn head(out: &mut Vec<u8>, ident: &[u8], ts: i64, kind: &[u8]) {
    out.extend_from_slice(b"{\"ts\":");
    push_int(out, ts);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(kind);
    out.extend_from_slice(b"\",");
    out.extend_from_slice(ident);
}

/// `key` (`,"span_id":"` say) and the id as 16 hex digits, where there is one.
fn push_id(out: &mut Vec<u8>, key: &[u8], id: Option<u64>) {
    if let Some(v) = id {
        out.extend_from_slice(key);
        push_hex16(out, v);
        out.push(b'"');
    }
}

/// `,"step":…`, where there is one.
fn push_step(out: &mut Vec<u8>, step: Option<i64>) {
    if let Some(s) = step {
        int_field(out, key!("step"), s);
    }
}

/// A string value of a line: text, escaped here, or its JSON written before (a level or logger name the
/// recorder caches).
#[derive(Clone, Copy)]
pub(crate) enum Text<'a> {
    Raw(&'a [u8]),
    Json(&'a [u8]),
}

fn push_text(out: &mut Vec<u8>, t: Text<'_>) {
    match t {
        Text::Raw(s) => json_str(out, s),
        Text::Json(j) => out.extend_from_slice(j),
    }
}

/// A log event's fields, those of the lane's strict Python `logging` line (time, level, logger, message)
/// and those only a recorded log record has (its span, exception text and step).
pub(crate) struct LogLine<'a> {
    pub ts: i64,
    pub span_id: Option<u64>,
    pub level: Text<'a>,
    pub logger: Text<'a>,
    pub msg: &'a [u8],
    pub exc: Option<&'a [u8]>,
    pub step: Option<i64>,
}

/// `{"ts","kind":"log",<identity>[,"span_id"],"level","logger","msg"[,"exc"][,"step"]}`: `_plain_line`'s
/// line (no span, exception or step) and `_encode_log`'s.
pub(crate) fn log_line(out: &mut Vec<u8>, ident: &[u8], l: &LogLine<'_>) {
    head(out, ident, l.ts, b"log");
    push_id(out, b",\"span_id\":\"", l.span_id);
    out.extend_from_slice(b",\"level\":");
    push_text(out, l.level);
    out.extend_from_slice(b",\"logger\":");
    push_text(out, l.logger);
    str_field(out, key!("msg"), l.msg);
    if let Some(e) = l.exc {
        str_field(out, key!("exc"), e);
    }
    push_step(out, l.step);
    out.extend_from_slice(b"}\n");
}

/// Where a recorded span is: its id, its parent's, its start and end (ns) and its step.
pub(crate) struct SpanPlace {
    pub sid: u64,
    pub parent: Option<u64>,
    pub start: i64,
    pub end: i64,
    pub step: Option<i64>,
}

/// A span line up to its attributes: identity, ids, `named` (`,"name":…,"cat":…` in parts), times, step.
fn span_head(out: &mut Vec<u8>, ident: &[u8], at: &SpanPlace, named: &[&[u8]]) {
    head(out, ident, at.end, b"span");
    push_id(out, b",\"span_id\":\"", Some(at.sid));
    push_id(out, b",\"parent_id\":\"", at.parent);
    for part in named {
        out.extend_from_slice(part);
    }
    int_field(out, key!("start"), at.start);
    int_field(out, key!("dur"), at.end - at.start);
    push_step(out, at.step);
}

/// `,"name":…,"cat":…` of a span line, from the name's and the category's JSON: written once per name and
/// category and shared by their spans (`span_line`'s `named`, as `_encode_span` caches it).
pub(crate) fn span_names(name: &[u8], cat: &[u8]) -> Chunk {
    let mut v = Vec::with_capacity(name.len() + cat.len() + 16);
    v.extend_from_slice(b",\"name\":");
    v.extend_from_slice(name);
    v.extend_from_slice(b",\"cat\":");
    v.extend_from_slice(cat);
    v.into()
}

/// `_encode_span`'s line: `named` is `,"name":…,"cat":…` (JSON, cached), `attrs` the attributes' JSON.
pub(crate) fn span_line(out: &mut Vec<u8>, ident: &[u8], at: &SpanPlace, named: &[u8], attrs: Option<&[u8]>) {
    span_head(out, ident, at, &[named]);
    if let Some(a) = attrs {
        raw_field(out, key!("attrs"), a);
    }
    out.extend_from_slice(b"}\n");
}

/// What a collective's span line says of the call (`op` and `group` as JSON; `error` the error's JSON).
pub(crate) struct CollectiveFields<'a> {
    pub op: &'a [u8],
    pub group: &'a [u8],
    pub size: i64,
    pub seq: i64,
    pub bytes: i64,
    pub is_async: bool,
    pub error: Option<&'a [u8]>,
}

/// A collective's span line, as `_encode_span` writes the item `_as_span` makes of it: category
/// `collective`, named for its op, with op, group, group size, sequence number and bytes as attributes.
pub(crate) fn collective_line(out: &mut Vec<u8>, ident: &[u8], at: &SpanPlace, c: &CollectiveFields<'_>) {
    span_head(out, ident, at, &[b",\"name\":", c.op, b",\"cat\":\"collective\""]);
    out.extend_from_slice(b",\"attrs\":{\"op\":");
    out.extend_from_slice(c.op);
    raw_field(out, key!("group"), c.group);
    int_field(out, key!("group_size"), c.size);
    int_field(out, key!("seq"), c.seq);
    int_field(out, key!("bytes"), c.bytes);
    if c.is_async {
        out.extend_from_slice(b",\"async\":true");
    }
    if let Some(e) = c.error {
        raw_field(out, key!("error"), e);
    }
    out.extend_from_slice(b"}}\n");
}

/// `_encode_metric`'s line: `{"ts","kind":"metric",<identity>[,"span_id"],"metrics":{…}[,"step"]}`.
pub(crate) fn metric_line(
    out: &mut Vec<u8>,
    ident: &[u8],
    ts: i64,
    span_id: Option<u64>,
    metrics: &[(Chunk, Num)],
    step: Option<i64>,
    sci_plus: Option<bool>,
) {
    head(out, ident, ts, b"metric");
    push_id(out, b",\"span_id\":\"", span_id);
    out.extend_from_slice(b",\"metrics\":");
    metric_map(out, metrics, sci_plus);
    push_step(out, step);
    out.extend_from_slice(b"}\n");
}
