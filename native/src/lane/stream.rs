//! The state the lane keeps of one stream (an `srun` label of a file, or the file): its output, clock offset,
//! last time, head layout, and the parsers' state dicts that it shares with Python's side of the stream.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::pending::Pending;
use super::FastLane;

// The head layout Python's head parser tries first for a stream (its last one): none yet, "iso",
// "deepspeed", or another.
pub(super) const LAYOUT_NONE: u8 = 0;
pub(super) const LAYOUT_ISO: u8 = 1;
pub(super) const LAYOUT_DEEPSPEED: u8 = 2;
pub(super) const LAYOUT_OTHER: u8 = 3;

/// The code of a layout Python names.
pub(super) fn layout_code(name: Option<&str>) -> u8 {
    match name {
        None => LAYOUT_NONE,
        Some("iso") => LAYOUT_ISO,
        Some("deepspeed") => LAYOUT_DEEPSPEED,
        Some(_) => LAYOUT_OTHER,
    }
}

/// One stream of the lane.
pub(super) struct Stream {
    /// The output it writes to; `None` until Python has made it (lines that write are Python's until then).
    pub(super) out: Option<usize>,
    /// The clock offset (ns) Python's alignment gives the stream, added to every time written.
    pub(super) offset: i64,
    /// `{"job":…,"v":1,` — what the Python engine puts before an encoded event dict.
    pub(super) open: Vec<u8>,
    /// `"job":…,"v":1` — the identity fields, for the lines written without a dict.
    pub(super) ident: Vec<u8>,
    pub(super) last_ts: Option<i64>,
    /// The layout of the last head read here since Python last saw the stream, and its epoch day
    /// (what Python's head parser must note).
    pub(super) head_note: Option<(&'static str, i64)>,
    /// The layout Python's head parser tries first for this stream (`LAYOUT_*`).
    pub(super) last_layout: u8,
    /// The stream's rank was guessed: DeepSpeed's `[Rank N]` then routes events (Python's job).
    pub(super) rank_guessed: bool,
    pub(super) deepspeed_state: Py<PyDict>,
    pub(super) megatron_state: Py<PyDict>,
    pub(super) huggingface_state: Py<PyDict>,
    /// Its lines without a time, waiting for the stream's next one.
    pub(super) pending: Vec<Pending>,
    /// Python holds a multi-line block or pending lines of this stream: all its lines go there.
    pub(super) busy: bool,
    /// A neighbouring stream's time (ns), for waiting lines of a stream that has none of its own yet; `None`
    /// sends them back to Python at the cap and at the end, which then knows the file's stamps.
    pub(super) fallback_ts: Option<i64>,
    pub(super) generic_state: Py<PyDict>,
}

impl FastLane {
    /// Write a dated line's events: the stream's waiting lines first (they get times up to `ts`), then the
    /// line's time and head (`note`, `layout`) become the stream's, then `write(buf, open, offset)` writes the
    /// events into the output's buffer, each after the `{identity,` prefix `open`, with the stream's clock
    /// offset. Returns the line's time as written (`ts + offset`).
    pub(super) fn write_dated(
        &mut self,
        si: usize,
        ts: i64,
        note: (&'static str, i64),
        layout: u8,
        write: impl FnOnce(&mut Vec<u8>, &[u8], i64),
    ) -> i64 {
        self.release(si, ts);
        let s = &mut self.streams[si];
        s.last_ts = Some(s.last_ts.map_or(ts, |l| l.max(ts)));
        s.head_note = Some(note);
        s.last_layout = layout;
        let (out, offset, open) = (s.out.expect("checked by the caller"), s.offset, std::mem::take(&mut s.open));
        write(self.out_buf(out), &open, offset);
        self.streams[si].open = open;
        ts + offset
    }
}
