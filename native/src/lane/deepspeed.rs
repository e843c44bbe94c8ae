//! DeepSpeed's logger lines (`[2024-05-01 12:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] …`), as
//! the "deepspeed" head layout and `ingest/parsers/deepspeed.py` read them: the progress lines (`step=…,
//! skipped=…, lr=[…], mom=…`: metrics, and a step span from the time since the last one) and the timer lines
//! (`time (ms) | fwd: … | bwd: … | step: …`: metrics, and the step's phase and collective spans).

use pyo3::prelude::*;

use super::dicts::get_int;
use super::generic_step::{find_step, next_pair};
use super::python_logging::LEVELS;
use super::stream::{LAYOUT_DEEPSPEED, LAYOUT_NONE, LAYOUT_OTHER};
use super::timestamps::{day_and_second, digits, utc_ns};
use super::{metric_value, printable, FastLane, GiveBack, LineAt, Moment};
use crate::line_writer::{is_plain, layout_span, log_event, metric_event, step_metric, step_span, LayoutSpan, StepSpan};

/// A "deepspeed" head: date, time of day and fraction digits, level (`None` for a word that names none),
/// logger (`file:line:func`), and where the message starts.
struct DsHead<'a> {
    date: &'a [u8],
    tod: &'a [u8],
    frac: &'a [u8],
    level: Option<&'static str>,
    logger: &'a [u8],
    body_at: usize,
}

/// The "deepspeed" head layout: `\[DATE TIME(?:[.,]\d{1,9})?\] \[(?P<level>[A-Z]+)\] \[(?P<logger>[^\]]*)\] ?`.
fn ds_head(t: &[u8]) -> Option<DsHead<'_>> {
    if !(t.first() == Some(&b'[') && digits(t, 1, 4) && t.get(5) == Some(&b'-') && digits(t, 6, 2)
        && t.get(8) == Some(&b'-') && digits(t, 9, 2) && t.get(11) == Some(&b' ') && digits(t, 12, 2)
        && t.get(14) == Some(&b':') && digits(t, 15, 2) && t.get(17) == Some(&b':') && digits(t, 18, 2))
    {
        return None;
    }
    let mut i = 20;
    let mut frac: &[u8] = &[];
    if matches!(t.get(i), Some(b'.') | Some(b',')) {
        let mut j = i + 1;
        while j < t.len() && t[j].is_ascii_digit() {
            j += 1;
        }
        if j - (i + 1) >= 1 && j - (i + 1) <= 9 && t.get(j) == Some(&b']') {
            frac = &t[i + 1..j];
            i = j;
        } else {
            return None;
        }
    }
    if !t[i..].starts_with(b"] [") {
        return None;
    }
    i += 3;
    let ls = i;
    while i < t.len() && t[i].is_ascii_uppercase() {
        i += 1;
    }
    if i == ls || !t[i..].starts_with(b"] [") {
        return None;
    }
    let word = &t[ls..i];
    let level = LEVELS.iter().find(|(w, _)| *w == word).map(|e| e.1).or(match word {
        b"I" => Some("INFO"),
        b"W" => Some("WARNING"),
        b"E" => Some("ERROR"),
        b"F" => Some("CRITICAL"),
        b"D" => Some("DEBUG"),
        _ => None,
    });
    i += 3;
    let gs = i;
    while i < t.len() && t[i] != b']' {
        i += 1;
    }
    if i >= t.len() {
        return None;
    }
    let logger = &t[gs..i];
    i += 1;
    if t.get(i) == Some(&b' ') {
        i += 1;
    }
    Some(DsHead { date: &t[1..11], tod: &t[12..20], frac, level, logger, body_at: i })
}

/// An event of a DeepSpeed line, before it is written.
enum DsEvent {
    /// `step`: `(step, written before the metrics)`.
    Metric { step: Option<(i64, bool)>, metrics: Vec<(String, f64)> },
    StepSpan { step: i64, dur: i64, id: String, source: &'static str },
    Part {
        step: i64,
        name: &'static str,
        cat: &'static str,
        start: i64,
        dur: i64,
        id: String,
        parent: Option<String>,
        collective: bool,
    },
}

impl FastLane {
    /// A DeepSpeed head (`[date time,frac] [LEVEL] [file:line:func]`), its time (UTC ns) and epoch day.
    fn ds_stamp<'a>(&self, text: &'a [u8]) -> Option<(DsHead<'a>, i64, i64)> {
        let h = ds_head(text)?;
        let (day, sod) = day_and_second(h.date, h.tod)?;
        let ts = utc_ns(day, sod, h.frac, self.tz_offset_s);
        Some((h, ts, day))
    }

    /// A DeepSpeed logger line (`[date time] [LEVEL] [file:line:func] …`) with a progress or timer message, as
    /// `DeepSpeedParser` reads it; everything else that starts with `[` is given back.
    pub(super) fn deepspeed_line(&mut self, py: Python<'_>, l: LineAt<'_>) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.deepspeed, l.ids)?;
        let si = l.si;
        {
            let st = &self.streams[si];
            // Python's head parser tries its last layout first: only these read a DeepSpeed head as "deepspeed" does.
            if st.out.is_none() || st.rank_guessed || st.last_layout == LAYOUT_OTHER {
                return Err(GiveBack);
            }
        }
        let (h, ts, day) = self.ds_stamp(l.text).ok_or(GiveBack)?;
        let body = &l.text[h.body_at..];
        if body.len() > self.cap || !printable(body) || !printable(h.logger) {
            return Err(GiveBack);
        }
        let body_s = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        // `[Rank N] ` (log_dist): routes nothing on a stream whose rank is known
        let rest = match body_s.strip_prefix("[Rank ") {
            Some(r) => {
                let r2 = r.strip_prefix('-').unwrap_or(r);
                let nd = r2.bytes().take_while(u8::is_ascii_digit).count();
                if nd > 0 && r2[nd..].starts_with("] ") { &r2[nd + 2..] } else { body_s }
            }
            None => body_s,
        };
        let events = if let Some(c) = self.c.ds_progress_rx.captures(rest) {
            self.ds_progress(py, si, ts, &c)?
        } else if let Some(c) = self.c.ds_timers_rx.captures(rest) {
            let items = c.get(1).unwrap().as_str().to_string();
            self.ds_timers(py, si, ts, &items)?
        } else {
            return Err(GiveBack); // throughput, overflow, loss scale, launcher lines: Python's
        };
        // Written: the line itself, then the parser's events.
        let logger = if h.logger.is_empty() { None } else { Some(h.logger) };
        let t = self.write_dated(si, ts, ("deepspeed", day), LAYOUT_DEEPSPEED, |buf, open, offset| {
            let t = ts + offset;
            log_event(buf, open, h.level.unwrap_or("INFO"), body, logger, t, false);
            for ev in &events {
                match ev {
                    // progress: {"kind","step","metrics"}; timers: {"kind","metrics","step"}
                    DsEvent::Metric { step: Some((st, true)), metrics: m } => step_metric(buf, open, *st, m, t, false),
                    DsEvent::Metric { step, metrics: m } => metric_event(buf, open, m, false, step.map(|s| s.0), t, false),
                    DsEvent::StepSpan { step, dur, id, source } => {
                        step_span(buf, open, &StepSpan { step: *step, dur: *dur, id, source, end: t }, false, false);
                    }
                    DsEvent::Part { step, name, cat, start, dur, id, parent, collective } => {
                        let span = LayoutSpan {
                            cat,
                            name,
                            step: *step,
                            start: start + offset,
                            dur: *dur,
                            id,
                            parent: parent.as_deref(),
                            collective: collective.then_some(("all_reduce", "deepspeed-timers")),
                        };
                        layout_span(buf, open, &span, false);
                    }
                }
            }
        });
        let metrics = events.iter().filter(|ev| matches!(ev, DsEvent::Metric { .. })).count() as u64;
        for ev in &events {
            if let DsEvent::StepSpan { step, source: "deepspeed", .. } = ev {
                self.sync.push((l.label, *step, t));
            }
        }
        self.counts.logs += 1;
        self.counts.metrics += metrics;
        self.counts.spans += events.len() as u64 - metrics;
        self.counts.deepspeed += 1;
        Ok(true)
    }

    /// `DeepSpeedParser._progress`; reads and updates the stream's parser state (nothing is written yet).
    fn ds_progress(&mut self, py: Python<'_>, si: usize, ts: i64, c: &regex::Captures<'_>) -> Result<Vec<DsEvent>, GiveBack> {
        let step: i64 = c[1].parse().map_err(|_| GiveBack)?;
        let skipped: i64 = c[2].parse().map_err(|_| GiveBack)?;
        let mut m: Vec<(String, f64)> = vec![("skipped_steps".into(), metric_value(skipped as f64)?)];
        let lr = c[3].trim_matches(|ch| ch == ' ' || ch == '[' || ch == ']');
        if !lr.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
            return Err(GiveBack); // `float()` of anything else: Python's
        }
        if let Ok(v) = lr.parse::<f64>() {
            m.push(("lr".into(), metric_value(v)?));
        }
        let state = self.streams[si].deepspeed_state.clone_ref(py);
        let state = state.bind(py);
        let prev_step = get_int(state, "step")?;
        let prev_ts = get_int(state, "ts")?;
        let mut events = vec![DsEvent::Metric { step: Some((step, true)), metrics: m }];
        if let (Some(ps), Some(pt)) = (prev_step, prev_ts) {
            if step > ps {
                let dur = (ts - pt).div_euclid(step - ps);
                if dur > 0 {
                    let id = self.new_span_id();
                    state.set_item("span", &id).map_err(|_| GiveBack)?;
                    events.push(DsEvent::StepSpan { step, dur, id, source: "deepspeed" });
                }
            }
        }
        state.set_item("step", step).map_err(|_| GiveBack)?;
        state.set_item("ts", ts).map_err(|_| GiveBack)?;
        state.set_item("timed", false).map_err(|_| GiveBack)?;
        Ok(events)
    }

    /// `DeepSpeedParser._timers`; reads and updates the stream's parser state (nothing is written yet).
    fn ds_timers(&mut self, py: Python<'_>, si: usize, ts: i64, items: &str) -> Result<Vec<DsEvent>, GiveBack> {
        let mut values: Vec<(String, f64)> = Vec::new();
        for c in self.c.ds_item_rx.captures_iter(items) {
            let Ok(v) = c[2].parse::<f64>() else { continue };
            match values.iter_mut().find(|(k, _)| k == &c[1]) {
                Some(e) => e.1 = v,
                None => values.push((c[1].to_string(), v)),
            }
        }
        let mut m = Vec::with_capacity(values.len());
        for (k, v) in &values {
            m.push((format!("timer_ms/{k}"), metric_value(*v)?));
        }
        let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|e| e.1);
        let state = self.streams[si].deepspeed_state.clone_ref(py);
        let state = state.bind(py);
        let mut step = get_int(state, "step")?;
        let mut events = Vec::new();
        if get("fwd").is_some() || get("bwd").is_some() || get("step").is_some() {
            let timed = match state.get_item("timed").map_err(|_| GiveBack)? {
                Some(v) => v.is_truthy().map_err(|_| GiveBack)?,
                None => false,
            };
            let own_span: Option<String>;
            let s = match step {
                Some(v) if !timed => {
                    own_span = match state.get_item("span").map_err(|_| GiveBack)? {
                        None => None,
                        Some(v) if v.is_none() => None,
                        // the phases' parent, written as it is: an id that would need escaping is Python's
                        Some(v) => Some(v.extract::<String>().ok().filter(|id| is_plain(id.as_bytes())).ok_or(GiveBack)?),
                    };
                    v
                }
                _ => {
                    own_span = None;
                    let base = match step {
                        Some(v) => v,
                        None => get_int(state, "timer_step")?.unwrap_or(-1),
                    };
                    base + 1
                }
            };
            let ms = 1e6;
            let allreduce = get("bwd_allreduce").unwrap_or(0.0);
            let backward = get("bwd_inner").unwrap_or_else(|| (get("bwd").unwrap_or(0.0) - allreduce).max(0.0));
            let mut parts = Vec::new();
            for (name, cat, v, coll) in [
                ("forward", "phase", get("fwd").unwrap_or(0.0), false),
                ("backward", "phase", backward, false),
                ("all_reduce", "collective", allreduce, true),
                ("optimizer", "phase", get("step").unwrap_or(0.0), false),
            ] {
                let x = v * ms;
                if x.is_nan() || x.abs() >= 9e18 {
                    return Err(GiveBack);
                }
                parts.push((name, cat, x as i64, coll));
            }
            // From here on the state changes: nothing is given back.
            if step.is_none() || timed {
                state.set_item("timer_step", s).map_err(|_| GiveBack)?;
            }
            state.set_item("timed", true).map_err(|_| GiveBack)?;
            step = Some(s);
            let mut parent = own_span;
            if parent.is_none() {
                let total: i64 = parts.iter().map(|p| p.2).sum();
                if total > 0 {
                    let id = self.new_span_id();
                    parent = Some(id.clone());
                    events.push(DsEvent::StepSpan { step: s, dur: total, id, source: "deepspeed-timers" });
                }
            }
            let kept: Vec<_> = parts.into_iter().filter(|p| p.2 > 0).collect();
            let mut at = ts - kept.iter().map(|p| p.2).sum::<i64>();
            for (name, cat, dur, coll) in kept {
                let id = self.new_span_id();
                events.push(DsEvent::Part {
                    step: s,
                    name,
                    cat,
                    start: at,
                    dur,
                    id,
                    parent: parent.clone().filter(|p| !p.is_empty()),
                    collective: coll,
                });
                at += dur;
            }
        }
        events.insert(0, DsEvent::Metric { step: step.map(|v| (v, false)), metrics: m });
        Ok(events)
    }

    /// `DeepSpeedParser.sync_step`, then (a timer line) the generic one, on a "deepspeed" head: the moment of a
    /// progress line, or of a timer line that the generic parser reads as a step.
    pub(super) fn deepspeed_moment(&mut self, label: Option<u32>, text: &[u8], ids: &[usize]) -> Result<Option<Moment>, GiveBack> {
        if !ids.iter().all(|&i| Some(i) == self.c.deepspeed || Some(i) == self.c.generic)
            || self.sync_layouts.get(&label).copied().unwrap_or(LAYOUT_NONE) == LAYOUT_OTHER
        {
            return Err(GiveBack);
        }
        let (h, ts, day) = self.ds_stamp(text).ok_or(GiveBack)?;
        let body = &text[h.body_at..];
        if !printable(body) {
            return Err(GiveBack);
        }
        let body = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        let step = match self.c.ds_progress_rx.captures(body) {
            Some(c) => Some(c[1].parse::<i64>().map_err(|_| GiveBack)?),
            None if ids.len() > 1 => match find_step(body)? {
                Some((st, after)) => next_pair(body, after)?.map(|_| st),
                None => None,
            },
            None => None,
        };
        self.sync_days.insert(label, ("deepspeed", day));
        self.sync_layouts.insert(label, LAYOUT_DEEPSPEED);
        Ok(step.map(|st| (label, st, ts)))
    }
}
