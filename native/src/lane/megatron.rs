//! Megatron-LM's iteration lines (`training_log`: ` [2024-05-01 12:00:00] iteration 10/ 1000 | consumed
//! samples: … | elapsed time per iteration (ms): … | lm loss: … |`), as the "bracket-iso" head layout and
//! `ingest/parsers/megatron.py` read them: the line's log, its metrics and its step span.

use pyo3::prelude::*;

use super::stream::LAYOUT_OTHER;
use super::timestamps::{day_and_second, digits, num, utc_ns};
use super::{metric_value, printable, FastLane, GiveBack, LineAt, Moment};
use crate::line_writer::{log_event, step_metric, step_span, StepSpan};

/// The "bracket-iso" head of a Megatron iteration line: ` ?\[DATE[ T_]TIME(?:[.,]\d{1,9})?\] ?` followed by
/// `iteration`, where the layout's optional level, logger and separator all fail (checked: none can start
/// at "iteration N"); `(UTC ns, epoch day, body start)`. A zone in the stamp: `None`.
fn megatron_head(t: &[u8], tz_offset_s: i64) -> Option<(i64, i64, usize)> {
    let b = if t.first() == Some(&b' ') { 1 } else { 0 };
    if !(t.get(b) == Some(&b'[') && digits(t, b + 1, 4) && t.get(b + 5) == Some(&b'-') && digits(t, b + 6, 2)
        && t.get(b + 8) == Some(&b'-') && digits(t, b + 9, 2) && matches!(t.get(b + 11), Some(b' ') | Some(b'T') | Some(b'_'))
        && digits(t, b + 12, 2) && t.get(b + 14) == Some(&b':') && digits(t, b + 15, 2) && t.get(b + 17) == Some(&b':')
        && digits(t, b + 18, 2))
    {
        return None;
    }
    let mut i = b + 20;
    let mut frac: &[u8] = &[];
    if matches!(t.get(i), Some(b'.') | Some(b',')) {
        let mut j = i + 1;
        while j < t.len() && t[j].is_ascii_digit() {
            j += 1;
        }
        if !(1..=9).contains(&(j - i - 1)) {
            return None;
        }
        frac = &t[i + 1..j];
        i = j;
    }
    if t.get(i) != Some(&b']') {
        return None;
    }
    i += 1;
    if t.get(i) == Some(&b' ') {
        i += 1;
    }
    let rest = &t[i..];
    // "iteration" then white space then a digit: no level, logger or separator of the layout's tail can match
    if !rest.starts_with(b"iteration") || !matches!(rest.get(9), Some(b' ')) {
        return None;
    }
    let (day, sod) = day_and_second(&t[b + 1..b + 11], &t[b + 12..b + 20])?;
    Some((utc_ns(day, sod, frac, tz_offset_s), day, i))
}

/// `iteration\s+(\d+)/\s*(\d+) \|` at the start of `body` (ASCII): `(it, total, end)`.
fn megatron_iter(body: &str) -> Option<(i64, i64, usize)> {
    let t = body.as_bytes();
    let mut i = "iteration".len();
    let s0 = i;
    while i < t.len() && matches!(t[i], b' ' | b'\t') {
        i += 1;
    }
    if i == s0 {
        return None;
    }
    let d0 = i;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    if i == d0 || t.get(i) != Some(&b'/') || i - d0 > 18 {
        return None;
    }
    let it = num(&t[d0..i]);
    i += 1;
    while i < t.len() && matches!(t[i], b' ' | b'\t') {
        i += 1;
    }
    let d1 = i;
    while i < t.len() && t[i].is_ascii_digit() {
        i += 1;
    }
    if i == d1 || i - d1 > 18 || !t[i..].starts_with(b" |") {
        return None;
    }
    Some((it, num(&t[d1..i]), i + 2))
}

/// The names `MegatronParser` gives Megatron-LM's keys (`_KEYS`); other keys by `metric_name`.
fn megatron_key(key: &str) -> Option<&'static str> {
    Some(match key {
        "consumed samples" => "consumed_samples",
        "skipped samples" => "skipped_samples",
        "elapsed time per iteration (ms)" => "iter_ms",
        "throughput per GPU (TFLOP/s/GPU)" => "tflops_per_gpu",
        "energy per GPU (J/iter/GPU)" => "energy_j_per_gpu",
        "power per GPU (W/GPU)" => "power_w_per_gpu",
        "learning rate" => "lr",
        "decoupled learning rate" => "decoupled_lr",
        "global batch size" => "global_batch_size",
        "loss scale" => "loss_scale",
        "grad norm" => "grad_norm",
        "num zeros" => "num_zeros",
        "params norm" => "params_norm",
        "number of skipped iterations" => "skipped_iters",
        "number of nan iterations" => "nan_iters",
        _ => return None,
    })
}

/// `_metric_name`: runs of other than ASCII letters and digits become `_`, stripped, lower case; or "value".
fn metric_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut gap = false;
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_lowercase());
        } else {
            gap = true;
        }
    }
    if out.is_empty() {
        "value".into()
    } else {
        out
    }
}

impl FastLane {
    /// A Megatron-LM iteration line (`training_log`: ` [date time] iteration N/ T | key: value | …`), as the
    /// "bracket-iso" head layout and `MegatronParser._iteration` read it.
    pub(super) fn megatron_line(&mut self, py: Python<'_>, l: LineAt<'_>) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.megatron, l.ids)?;
        let si = l.si;
        if self.streams[si].out.is_none() {
            return Err(GiveBack);
        }
        let (ts, day, body_at) = megatron_head(l.text, self.tz_offset_s).ok_or(GiveBack)?;
        let body = &l.text[body_at..];
        if body.len() > self.cap || !printable(body) {
            return Err(GiveBack);
        }
        let body_s = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        let (it, total, at) = megatron_iter(body_s).ok_or(GiveBack)?;
        let mut m: Vec<(String, f64)> = vec![("train_iters".into(), metric_value(total as f64)?)];
        let mut values: Vec<(String, f64)> = Vec::new(); // the numbers behind m, by name
        let mut first_loss: Option<f64> = None;
        for field in body_s[at..].split('|') {
            let Some((key, raw)) = field.split_once(':') else { continue };
            let key = key.trim();
            if key.is_empty() {
                continue;
            }
            // `number(raw)`: float(raw.strip().rstrip(",")); only plain decimal numbers here
            let r = raw.trim().trim_end_matches(',').trim();
            if r.is_empty() || !r.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
                return Err(GiveBack);
            }
            let Ok(v) = r.parse::<f64>() else { continue };
            let name = match megatron_key(key) {
                Some(n) => n.to_string(),
                None => {
                    let n = metric_name(key);
                    if key.contains("loss") && !key.contains("scale") && first_loss.is_none() {
                        first_loss = Some(v);
                    }
                    n
                }
            };
            let j = metric_value(v)?;
            match m.iter_mut().find(|(k, _)| *k == name) {
                Some(e) => e.1 = j,
                None => m.push((name.clone(), j)),
            }
            match values.iter_mut().find(|(k, _)| *k == name) {
                Some(e) => e.1 = v,
                None => values.push((name, v)),
            }
        }
        let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|e| e.1);
        if let Some(l) = first_loss {
            if !m.iter().any(|(k, _)| k == "loss") {
                m.push(("loss".into(), metric_value(l)?));
            }
        } else if get("nan_iters").is_some_and(|v| v != 0.0) {
            match m.iter_mut().find(|(k, _)| k == "loss") {
                Some(e) => e.1 = f64::NAN, // metric_value(nan): "NaN"
                None => m.push(("loss".into(), f64::NAN)),
            }
        }
        let iter_ms = get("iter_ms");
        if iter_ms.is_some_and(|v| !v.is_finite()) || get("global_batch_size").is_some_and(|v| !v.is_finite()) {
            return Err(GiveBack); // metric_value() made them strings: Python's
        }
        if let (Some(ms), Some(batch)) = (iter_ms, get("global_batch_size")) {
            if ms > 0.0 {
                let x = batch / (ms / 1000.0);
                if !x.is_finite() {
                    return Err(GiveBack);
                }
                // round(x, 3): Rust's fixed precision rounds the exact value half to even, as Python's round does
                let r: f64 = format!("{:.3}", x).parse().map_err(|_| GiveBack)?;
                if !r.is_finite() {
                    return Err(GiveBack);
                }
                let j = metric_value(r)?;
                match m.iter_mut().find(|(k, _)| k == "samples_per_s") {
                    Some(e) => e.1 = j,
                    None => m.push(("samples_per_s".into(), j)),
                }
            }
        }
        let dur = match iter_ms {
            Some(ms) if ms > 0.0 => {
                if !(ms * 1e6).is_finite() || ms * 1e6 >= 9e18 {
                    return Err(GiveBack);
                }
                Some((ms * 1e6) as i64)
            }
            _ => None,
        };
        // From here on the state changes and the events are written.
        let id = dur.map(|_| self.new_span_id());
        {
            let st = self.streams[si].megatron_state.bind(py);
            st.set_item("iteration", it).map_err(|_| GiveBack)?;
            st.set_item("iter_ms", iter_ms).map_err(|_| GiveBack)?;
            if let Some(id) = &id {
                st.set_item("step_span", id).map_err(|_| GiveBack)?;
            }
        }
        let t = self.write_dated(si, ts, ("bracket-iso", day), LAYOUT_OTHER, |buf, open, offset| {
            let t = ts + offset;
            log_event(buf, open, "INFO", body, None, t, false);
            step_metric(buf, open, it, &m, t, false);
            if let (Some(dur), Some(id)) = (dur, &id) {
                step_span(buf, open, &StepSpan { step: it, dur, id, source: "megatron", end: t }, true, false);
            }
        });
        if id.is_some() {
            self.sync.push((l.label, it, t)); // the step span's end
            self.counts.spans += 1;
        }
        self.counts.logs += 1;
        self.counts.metrics += 1;
        self.counts.megatron += 1;
        Ok(true)
    }

    /// `MegatronParser.sync_step` on a bracket-iso head (the first sync parser, so its answer stands): the
    /// iteration's moment.
    pub(super) fn megatron_moment(&mut self, label: Option<u32>, text: &[u8]) -> Result<Option<Moment>, GiveBack> {
        let (ts, day, at) = megatron_head(text, self.tz_offset_s).ok_or(GiveBack)?;
        let body = std::str::from_utf8(&text[at..]).map_err(|_| GiveBack)?;
        if !body.is_ascii() {
            return Err(GiveBack);
        }
        let (it, _, _) = megatron_iter(body).ok_or(GiveBack)?;
        self.sync_days.insert(label, ("bracket-iso", day));
        self.sync_layouts.insert(label, LAYOUT_OTHER);
        Ok(Some((label, it, ts)))
    }
}
