//! Python `logging` lines in the strict form of `ingest/_plain.py`
//! (`2024-05-01 12:00:00,123 - INFO - train - message`): their head, and the line that no parser wants.

use super::stream::LAYOUT_ISO;
use super::timestamps::{day_and_second, digits, utc_ns};
use super::{FastLane, GiveBack};
use crate::line_writer::{log_event, log_line, LogLine, Text};

/// The level words the heads admit, and the level names they stand for (`level_name`).
pub(super) const LEVELS: [(&[u8], &str); 9] = [
    (b"DEBUG", "DEBUG"),
    (b"INFO", "INFO"),
    (b"WARNING", "WARNING"),
    (b"WARN", "WARNING"),
    (b"ERROR", "ERROR"),
    (b"CRITICAL", "CRITICAL"),
    (b"FATAL", "CRITICAL"),
    (b"TRACE", "DEBUG"),
    (b"NOTICE", "INFO"),
];

/// A strict head: its date, time of day and fraction digits, level, logger, and where the message starts.
pub(super) struct Head<'a> {
    date: &'a [u8],
    tod: &'a [u8],
    frac: &'a [u8],
    pub(super) level: &'static str,
    pub(super) logger: &'a [u8],
    pub(super) body_at: usize,
}

fn is_logger_first(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'<'
}

fn is_logger_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'<' | b'>')
}

/// `(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)[.,](\d{1,9}) - (LEVEL) - (logger) - (?=[!-~]|$)`.
pub(super) fn strict_head(t: &[u8]) -> Option<Head<'_>> {
    if !(digits(t, 0, 4) && t.get(4) == Some(&b'-') && digits(t, 5, 2) && t.get(7) == Some(&b'-')
        && digits(t, 8, 2) && t.get(10) == Some(&b' ') && digits(t, 11, 2) && t.get(13) == Some(&b':')
        && digits(t, 14, 2) && t.get(16) == Some(&b':') && digits(t, 17, 2)
        && matches!(t.get(19), Some(b'.') | Some(b',')))
    {
        return None;
    }
    let mut i = 20;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    let nfrac = i - 20;
    if nfrac == 0 || nfrac > 9 || !t[i..].starts_with(b" - ") {
        return None;
    }
    let frac = &t[20..i];
    i += 3;
    let lstart = i;
    while i < t.len() && t[i].is_ascii_uppercase() {
        i += 1;
    }
    let word = &t[lstart..i];
    let level = LEVELS.iter().find(|(w, _)| *w == word)?.1;
    if !t[i..].starts_with(b" - ") {
        return None;
    }
    i += 3;
    let gstart = i;
    if i >= t.len() || !is_logger_first(t[i]) {
        return None;
    }
    i += 1;
    while i < t.len() && is_logger_char(t[i]) {
        i += 1;
    }
    if i - gstart > 201 || !t[i..].starts_with(b" - ") {
        return None;
    }
    let logger = &t[gstart..i];
    i += 3;
    if i < t.len() && !(0x21..=0x7e).contains(&t[i]) {
        return None;
    }
    Some(Head { date: &t[0..10], tod: &t[11..19], frac, level, logger, body_at: i })
}

impl FastLane {
    /// A strict head's time (UTC ns) and epoch day; `None` for a date or time Python rejects.
    pub(super) fn stamp(&self, h: &Head<'_>) -> Option<(i64, i64)> {
        let (day, sod) = day_and_second(h.date, h.tod)?;
        Some((utc_ns(day, sod, h.frac, self.tz_offset_s), day))
    }

    /// A strict Python logging line that no parser wants: one log event, spliced as `_plain_line` writes it.
    pub(super) fn plain(&mut self, si: usize, (ts, day): (i64, i64), h: &Head<'_>, body: &[u8]) -> Result<bool, GiveBack> {
        if body.len() > self.cap {
            return Err(GiveBack);
        }
        if !self.streams[si].pending.is_empty() {
            // As the Python engine's general path: pending lines first, then the line as an event dict.
            self.write_dated(si, ts, ("iso", day), LAYOUT_ISO, |buf, open, offset| {
                log_event(buf, open, h.level, body, Some(h.logger), ts + offset, false);
            });
        } else {
            let s = &mut self.streams[si];
            s.last_ts = Some(ts);
            s.head_note = Some(("iso", day));
            s.last_layout = LAYOUT_ISO;
            let (offset, out) = (s.offset, s.out.expect("checked in line()"));
            let ident = std::mem::take(&mut s.ident);
            let buf = self.out_buf(out);
            let line = LogLine {
                ts: ts + offset,
                span_id: None,
                level: Text::Raw(h.level.as_bytes()),
                logger: Text::Raw(h.logger),
                msg: body,
                exc: None,
                step: None,
            };
            log_line(buf, &ident, &line);
            self.streams[si].ident = ident;
        }
        self.counts.logs += 1;
        Ok(true)
    }
}
