//! Lines without a time, which wait (as in the Python engine's `_emit`) for the stream's next dated line
//! and then get times spread between the two: `print` lines, and the events of NCCL lines, tqdm
//! refreshes and Hugging Face Trainer dicts. Also how they cross to and from Python's side of a stream
//! (as the event dicts `_emit` keeps).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::dicts::{item, keys_of};
use super::{FastLane, GiveBack};
use crate::line_writer::{json_float, log_event, metric_event, nccl_event, step_metric, step_span, NcclFields, StepSpan};

/// A line without a timestamp, waiting (as in the Python engine) for the stream's next one.
pub(super) enum Pending {
    Print { msg: String },
    /// A step span of a tqdm bar (`HuggingFaceParser._bar`), `dt` before the line's (estimated) time.
    TqdmSpan { step: i64, dur: i64, id: String, dt: i64 },
    TqdmMetric { n: i64, total: i64 },
    /// A metric event without a time of its own in the layout of `HuggingFaceParser._metrics`:
    /// `{"kind":"metric","metrics":{…}}`, then `"attrs":{"step_estimated":true}` when `estimated`, then `"step"`.
    /// The metrics are finite floats in decimal notation (`json_float` writes them), checked where they are made
    /// or adopted.
    DictMetric { metrics: Vec<(String, f64)>, step: Option<i64>, estimated: bool },
    Nccl { level: &'static str, msg: String, host: String, pid: i64, tid: i64, dev: i64, src: Option<String> },
}


impl Pending {
    /// A pending event dict of a kind the lane writes, as `write` writes it (exact keys and order).
    pub(super) fn from_dict(ev: &Bound<'_, PyDict>) -> Option<Pending> {
        let keys = keys_of(ev)?;
        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
        let exact_int = |v: &Bound<'_, PyAny>| v.is_exact_instance_of::<pyo3::types::PyInt>();
        match k.as_slice() {
            ["kind", "level", "msg"] => {
                if item::<String>(ev, "kind")? != "log" || item::<String>(ev, "level")? != "INFO" {
                    return None;
                }
                Some(Pending::Print { msg: item::<String>(ev, "msg")? })
            }
            ["kind", "level", "logger", "msg", "attrs"] => {
                if item::<String>(ev, "kind")? != "log" || item::<String>(ev, "logger")? != "nccl" {
                    return None;
                }
                let level = match item::<String>(ev, "level")?.as_str() {
                    "INFO" => "INFO",
                    "WARNING" => "WARNING",
                    "DEBUG" => "DEBUG",
                    _ => return None,
                };
                let a = ev.get_item("attrs").ok().flatten()?.cast_into::<PyDict>().ok()?;
                let ak = keys_of(&a)?;
                let with_src = match ak.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                    ["nccl_host", "nccl_pid", "tid", "cuda_dev"] => false,
                    ["nccl_host", "nccl_pid", "tid", "cuda_dev", "src"] => true,
                    _ => return None,
                };
                for key in ["nccl_pid", "tid", "cuda_dev"] {
                    if !exact_int(&a.get_item(key).ok().flatten()?) {
                        return None;
                    }
                }
                Some(Pending::Nccl {
                    level,
                    msg: item::<String>(ev, "msg")?,
                    host: item::<String>(&a, "nccl_host")?,
                    pid: item::<i64>(&a, "nccl_pid")?,
                    tid: item::<i64>(&a, "tid")?,
                    dev: item::<i64>(&a, "cuda_dev")?,
                    src: if with_src { Some(item::<String>(&a, "src")?) } else { None },
                })
            }
            ["kind", "metrics"] | ["kind", "metrics", "step"] | ["kind", "metrics", "attrs", "step"] => {
                if item::<String>(ev, "kind")? != "metric" {
                    return None;
                }
                let m = ev.get_item("metrics").ok().flatten()?.cast_into::<PyDict>().ok()?;
                let mut metrics = Vec::with_capacity(m.len());
                for (key, v) in m.iter() {
                    // floats only (NaN and infinities are strings there), each one that json_float writes
                    if !v.is_exact_instance_of::<pyo3::types::PyFloat>() {
                        return None;
                    }
                    let x: f64 = v.extract().ok()?;
                    json_float(x)?;
                    metrics.push((key.extract::<String>().ok()?, x));
                }
                let estimated = k.len() == 4;
                if estimated {
                    let a = ev.get_item("attrs").ok().flatten()?.cast_into::<PyDict>().ok()?;
                    let flag = a.get_item("step_estimated").ok().flatten()?;
                    if a.len() != 1 || !flag.is_exact_instance_of::<pyo3::types::PyBool>() || !flag.is_truthy().ok()? {
                        return None;
                    }
                }
                let step = match ev.get_item("step").ok().flatten() {
                    Some(v) if exact_int(&v) => Some(v.extract::<i64>().ok()?),
                    Some(_) => return None,
                    None => None,
                };
                Some(Pending::DictMetric { metrics, step, estimated })
            }
            _ => None,
        }
    }

    /// The event dict Python's side keeps for it (`export`): `{"kind":…,…}` as the parser made it.
    pub(super) fn into_dict(self, py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("kind", "log")?;
        match self {
            Pending::Print { msg } => {
                d.set_item("level", "INFO")?;
                d.set_item("msg", msg)?;
            }
            Pending::TqdmSpan { step, dur, id, dt } => {
                d.del_item("kind")?;
                d.set_item("kind", "span")?;
                d.set_item("cat", "step")?;
                d.set_item("name", "step")?;
                d.set_item("step", step)?;
                d.set_item("dur", dur)?;
                d.set_item("span_id", id)?;
                let a = PyDict::new(py);
                a.set_item("source", "tqdm")?;
                d.set_item("attrs", a)?;
                d.set_item("dt", dt)?;
            }
            Pending::TqdmMetric { n, total } => {
                d.del_item("kind")?;
                d.set_item("kind", "metric")?;
                d.set_item("step", n)?;
                let m = PyDict::new(py);
                m.set_item("progress", n as f64)?;
                m.set_item("progress_total", total as f64)?;
                d.set_item("metrics", m)?;
            }
            Pending::DictMetric { metrics, step, estimated } => {
                d.set_item("kind", "metric")?; // "kind" keeps its first place
                let m = PyDict::new(py);
                for (k, v) in metrics {
                    m.set_item(k, v)?;
                }
                d.set_item("metrics", m)?;
                if estimated {
                    let a = PyDict::new(py);
                    a.set_item("step_estimated", true)?;
                    d.set_item("attrs", a)?;
                }
                if let Some(step) = step {
                    d.set_item("step", step)?;
                }
            }
            Pending::Nccl { level, msg, host, pid, tid, dev, src } => {
                d.set_item("level", level)?;
                d.set_item("logger", "nccl")?;
                d.set_item("msg", msg)?;
                let a = PyDict::new(py);
                a.set_item("nccl_host", host)?;
                a.set_item("nccl_pid", pid)?;
                a.set_item("tid", tid)?;
                a.set_item("cuda_dev", dev)?;
                if let Some(src) = src {
                    a.set_item("src", src)?;
                }
                d.set_item("attrs", a)?;
            }
        }
        Ok(d)
    }

    /// Its event line at time `ts` (clock offset applied), marked estimated (`"est":true`) as `_write` marks
    /// the events of released lines.
    fn write(&self, buf: &mut Vec<u8>, open: &[u8], ts: i64) {
        match self {
            Pending::Print { msg } => log_event(buf, open, "INFO", msg.as_bytes(), None, ts, true),
            Pending::TqdmSpan { step, dur, id, dt } => {
                let span = StepSpan { step: *step, dur: *dur, id, source: "tqdm", end: ts + dt };
                step_span(buf, open, &span, true, true);
            }
            Pending::TqdmMetric { n, total } => {
                step_metric(buf, open, *n, &[("progress", *n as f64), ("progress_total", *total as f64)], ts, true);
            }
            Pending::DictMetric { metrics, step, estimated } => metric_event(buf, open, metrics, *estimated, *step, ts, true),
            Pending::Nccl { level, msg, host, pid, tid, dev, src } => {
                let attrs = NcclFields { host, pid: *pid, tid: *tid, dev: *dev, src: src.as_deref() };
                nccl_event(buf, open, level, msg, &attrs, ts);
            }
        }
    }
}

impl FastLane {
    /// Lines without a timestamp wait for the stream's next one (`upto`); then they get times spread between.
    pub(super) fn release(&mut self, si: usize, upto: i64) {
        let s = &self.streams[si];
        if s.pending.is_empty() {
            return;
        }
        let lo = s.last_ts.unwrap_or(upto);
        self.write_released(si, lo, if upto >= lo { upto } else { lo });
    }

    /// Spread the pending lines' times over `(lo, hi)` (all at `lo` when the range is empty) and write them.
    pub(super) fn write_released(&mut self, si: usize, lo: i64, hi: i64) -> i64 {
        let s = &mut self.streams[si];
        let n = s.pending.len() as i64;
        let pend = std::mem::take(&mut s.pending);
        let (open, offset, out) = (std::mem::take(&mut s.open), s.offset, s.out.expect("checked by the caller"));
        self.counts.estimated += n as u64;
        for p in &pend {
            match p {
                Pending::TqdmSpan { .. } => self.counts.spans += 1,
                Pending::TqdmMetric { .. } | Pending::DictMetric { .. } => self.counts.metrics += 1,
                _ => self.counts.logs += 1,
            }
        }
        let buf = self.out_buf(out);
        let mut t = lo;
        for (i, p) in pend.into_iter().enumerate() {
            t = released_ts(lo, hi, i as i64, n);
            p.write(buf, &open, t + offset);
        }
        self.streams[si].open = open;
        t
    }

    /// Add a line's one pending event (a `print`, an NCCL line); at the cap, release them all as `_emit` does.
    pub(super) fn push_pending(&mut self, si: usize, p: Pending) -> Result<bool, GiveBack> {
        let s = &mut self.streams[si];
        if s.pending.len() + 1 >= self.pending_cap {
            // Too many lines without a time: as the Python engine, write them all at the stream's last
            // time (or its neighbour's), which then stays the stream's last time.
            let Some(lo) = s.last_ts.or(s.fallback_ts).filter(|_| s.out.is_some()) else { return Err(GiveBack) };
            s.pending.push(p);
            let last = self.write_released(si, lo, lo);
            self.streams[si].last_ts = Some(last);
            return Ok(true);
        }
        s.pending.push(p);
        Ok(true)
    }

    /// Whether `k` more pending events fit before the cap, or the stream can release them as Python would.
    pub(super) fn check_room(&self, si: usize, k: usize) -> Result<(), GiveBack> {
        let s = &self.streams[si];
        if s.pending.len() + k >= self.pending_cap && (s.last_ts.or(s.fallback_ts).is_none() || s.out.is_none()) {
            return Err(GiveBack);
        }
        Ok(())
    }

    /// Append a line's pending events, then (as `_emit`) release them all at the cap.
    pub(super) fn push_pending_all(&mut self, si: usize, events: Vec<Pending>) {
        let s = &mut self.streams[si];
        s.pending.extend(events);
        if s.pending.len() >= self.pending_cap {
            let lo = s.last_ts.or(s.fallback_ts).expect("checked by check_room");
            let last = self.write_released(si, lo, lo);
            self.streams[si].last_ts = Some(last);
        }
    }

    /// A line that no head layout starts and no trigger matched: a `print`, one log event waiting for a time.
    pub(super) fn print_line(&mut self, si: usize, text: &[u8]) -> Result<bool, GiveBack> {
        if text.len() > self.cap {
            return Err(GiveBack);
        }
        let msg = String::from_utf8(text.to_vec()).map_err(|_| GiveBack)?;
        self.push_pending(si, Pending::Print { msg })
    }
}

/// The time of the `i`-th of `n` lines released between `lo` and `hi` (as `Output.release_pending`):
/// evenly spaced between them, or, with no room (`hi <= lo`), one nanosecond apart after `lo`, so that
/// no two lines share a time (a backend keeps one of two byte-identical events) and a sort by time keeps
/// the file's order.
fn released_ts(lo: i64, hi: i64, i: i64, n: i64) -> i64 {
    if hi > lo { lo + (hi - lo) * (i + 1) / (n + 1) } else { lo + i + 1 }
}
