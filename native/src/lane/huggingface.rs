//! Hugging Face Trainer output, as `ingest/parsers/huggingface.py` reads it: tqdm progress bar refreshes
//! (step spans and progress) and the Trainer's metric dicts (`{'loss': 2.3456, 'learning_rate': 4.5e-05, …}`).
//! Neither has a time: their events wait for the stream's next one.

use pyo3::prelude::*;

use super::dicts::{get_float, get_int};
use super::generic_step::is_word;
use super::pending::Pending;
use super::{FastLane, GiveBack, LineAt};
use crate::line_writer::json_float;

/// `_KEYS` of `ingest/parsers/huggingface.py`: the Trainer's names that the events shorten.
fn hf_name(key: &str) -> &str {
    match key {
        "learning_rate" => "lr",
        "train_samples_per_second" => "train_samples_per_s",
        "train_steps_per_second" => "train_steps_per_s",
        k => k,
    }
}

/// A plain decimal number at the start of `t`, as `repr()` of a float or an int and `f"{v:.4g}"` print them:
/// `-?(0|[1-9]\d{0,19})(\.\d{1,24})?([eE][-+]?\d{1,3})?`; `(its end, whether it is an int)`. Leading zeros
/// (a syntax error for `ast.literal_eval`), underscores, `nan`/`inf` and long digit runs (past the int-to-str
/// limit, or a float of an int that overflows) are left out: those lines are Python's.
fn plain_number(t: &[u8]) -> Option<(usize, bool)> {
    let run = |from: usize| t[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = usize::from(t.first() == Some(&b'-'));
    let int = run(i);
    if int == 0 || int > 20 || (int > 1 && t[i] == b'0') {
        return None;
    }
    i += int;
    let mut is_int = true;
    if t.get(i) == Some(&b'.') {
        let frac = run(i + 1);
        if frac == 0 || frac > 24 {
            return None;
        }
        i += 1 + frac;
        is_int = false;
    }
    if matches!(t.get(i), Some(b'e') | Some(b'E')) {
        i += 1;
        if matches!(t.get(i), Some(b'+') | Some(b'-')) {
            i += 1;
        }
        let exp = run(i);
        if exp == 0 || exp > 3 {
            return None;
        }
        i += exp;
        is_int = false;
    }
    Some((i, is_int))
}

/// The metrics of a line that is exactly a Trainer metric dict, `{'key': value, 'key2': value2}` with keys
/// `[A-Za-z_][A-Za-z0-9_/.-]*`, each once, and values that are plain numbers (`plain_number`), bare or
/// single-quoted: what `ast.literal_eval` and `number()` make of it, renamed (`_KEYS`; a name met again keeps
/// its first place and takes the last value, as a dict does). `None` for any other shape or a value whose JSON
/// text could differ (`json_float`); `_DICT.search` finds this whole line as the blob.
fn hf_dict(t: &[u8]) -> Option<Vec<(String, f64)>> {
    if t.first() != Some(&b'{') || t.last() != Some(&b'}') {
        return None;
    }
    let mut raw: Vec<(&str, f64)> = Vec::new();
    let mut i = 1;
    loop {
        if t.get(i) != Some(&b'\'') || !t.get(i + 1).is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_') {
            return None;
        }
        let k0 = i + 1;
        let mut k = k0 + 1;
        while k < t.len() && (is_word(t[k]) || matches!(t[k], b'/' | b'.' | b'-')) {
            k += 1;
        }
        if !t[k..].starts_with(b"': ") {
            return None;
        }
        let key = std::str::from_utf8(&t[k0..k]).ok()?;
        if raw.iter().any(|(seen, _)| *seen == key) {
            return None; // a key given twice: the dict keeps its first place and last value; rare, Python's
        }
        let quoted = t.get(k + 3) == Some(&b'\'');
        let v0 = k + 3 + usize::from(quoted);
        let (len, is_int) = plain_number(&t[v0..])?;
        let mut x: f64 = std::str::from_utf8(&t[v0..v0 + len]).ok()?.parse().ok()?;
        if is_int && !quoted && x == 0.0 {
            x = 0.0; // `-0` is the int 0, whose float is 0.0 (a string "-0" is float -0.0)
        }
        if !x.is_finite() || json_float(x).is_none() {
            return None; // `1e999` (metric_value's "Infinity") or a float orjson writes with an exponent
        }
        raw.push((key, x));
        i = v0 + len;
        if quoted {
            if t.get(i) != Some(&b'\'') {
                return None;
            }
            i += 1;
        }
        if i == t.len() - 1 {
            break; // the closing brace
        }
        if !t[i..].starts_with(b", ") {
            return None;
        }
        i += 2;
    }
    let mut metrics: Vec<(String, f64)> = Vec::with_capacity(raw.len());
    for (key, x) in raw {
        let name = hf_name(key);
        match metrics.iter_mut().find(|(k, _)| k == name) {
            Some(e) => e.1 = x,
            None => metrics.push((name.to_string(), x)),
        }
    }
    Some(metrics)
}

/// `_seconds`: `H:M:S` (any number of parts) as seconds; `None` when a part is empty (not an int).
fn seconds(text: &str) -> Result<Option<f64>, GiveBack> {
    let mut total: i64 = 0;
    for p in text.split(':') {
        if p.is_empty() {
            return Ok(None);
        }
        if p.len() > 12 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(GiveBack); // huge, or digits `int()` reads and Rust does not
        }
        total = total.checked_mul(60).and_then(|v| v.checked_add(p.parse::<i64>().ok()?)).ok_or(GiveBack)?;
    }
    Ok(Some(total as f64))
}

impl FastLane {
    /// A tqdm refresh without a description (`  12%|█▏   | 120/1000 [00:30<03:40,  4.00it/s]`), as
    /// `HuggingFaceParser._bar` reads it: steps, progress, or a counted skip; all wait for a time.
    pub(super) fn tqdm_line(&mut self, py: Python<'_>, l: LineAt<'_>) -> Result<bool, GiveBack> {
        let (si, text) = (l.si, l.text);
        if text.len() > self.cap || self.streams[si].out.is_none() {
            return Err(GiveBack);
        }
        let t = std::str::from_utf8(text).map_err(|_| GiveBack)?;
        let bar_at = t.find('|').ok_or(GiveBack)?;
        if t[..bar_at].contains(": ") || t.contains("{'") {
            return Err(GiveBack); // a description (or a metrics dict): Python's
        }
        let c = self.c.tqdm_rx.captures(t).ok_or(GiveBack)?;
        if !(2..=7).all(|k| c[k].is_ascii()) {
            return Err(GiveBack); // `\d` admits digits that Python's int() and float() read and Rust's do not
        }
        let int = |k: usize| c[k].parse::<i64>().map_err(|_| GiveBack);
        let (n, total) = (int(2)?, int(3)?);
        let el = seconds(&c[4])?;
        let st = self.streams[si].huggingface_state.clone_ref(py);
        let st = st.bind(py);
        let bar: Option<(String, i64)> = match st.get_item("bar").map_err(|_| GiveBack)? {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => Some(v.extract().map_err(|_| GiveBack)?),
        };
        let key = (String::new(), total);
        let state_n = get_int(st, "n")?;
        // Lines waiting for a time: Python releases them all at once past the cap; so does the lane.
        let mut events: Vec<Pending> = Vec::new();
        let skip: Option<&'static str>;
        if bar.is_none() || (bar.as_ref() == Some(&key) && n < state_n.unwrap_or(0)) {
            skip = if n == 0 { Some("progress bar start") } else { None };
            self.check_room(si, if skip.is_some() { 0 } else { 1 })?;
            st.set_item("bar", (String::new(), total)).map_err(|_| GiveBack)?;
            st.set_item("n", n).map_err(|_| GiveBack)?;
            st.set_item("el", el).map_err(|_| GiveBack)?;
        } else if bar.as_ref() != Some(&key) {
            skip = Some("progress of another bar (evaluation)");
        } else {
            let prev = state_n.unwrap_or(0);
            if n <= prev {
                skip = Some("progress bar refresh without a new step");
            } else {
                skip = None;
                let rate_s = &c[6];
                let rate = if rate_s == "?" { None } else { rate_s.parse::<f64>().ok() };
                let mut per_step: Option<f64> = None;
                match rate {
                    Some(r) if r != 0.0 && r > 0.0 => per_step = Some(if &c[7] == "s/it" { r } else { 1.0 / r }),
                    _ => {
                        let prev_el = get_float(st, "el")?;
                        if let (Some(e), Some(p)) = (el, prev_el) {
                            if e > p {
                                per_step = Some((e - p) / (n - prev) as f64);
                            }
                        }
                    }
                }
                let mut k = 1;
                let mut dur = 0i64;
                let mut first = n + 1;
                if let Some(ps) = per_step.filter(|v| *v > 0.0) {
                    if !(ps * 1e9).is_finite() || ps * 1e9 >= 9e18 {
                        return Err(GiveBack);
                    }
                    dur = (ps * 1e9) as i64;
                    first = (prev + 1).max(n - 10_000 + 1);
                    k += (n - first + 1) as usize;
                }
                self.check_room(si, k + 1)?;
                st.set_item("n", n).map_err(|_| GiveBack)?;
                st.set_item("el", el).map_err(|_| GiveBack)?;
                for step in first..=n {
                    let id = self.new_span_id();
                    events.push(Pending::TqdmSpan { step, dur, id, dt: -(n - step) * dur });
                }
                events.push(Pending::TqdmMetric { n, total });
            }
        }
        self.counts.huggingface += 1;
        if let Some(reason) = skip {
            match self.counts.skipped.iter_mut().find(|(r, _)| *r == reason) {
                Some(e) => e.1 += 1,
                None => self.counts.skipped.push((reason, 1)),
            }
            self.skipped_line = true;
            return Ok(true);
        }
        let msg = t.to_string();
        let mut all = Vec::with_capacity(events.len() + 1);
        all.push(Pending::Print { msg }); // the line itself, as `_parse` adds it
        all.extend(events);
        self.push_pending_all(si, all);
        Ok(true)
    }

    /// A Hugging Face Trainer metric dict (`ProgressCallback.on_log`: `str(logs)`, or since transformers 4.46 with
    /// the floats as `f"{v:.4g}"` strings), as `HuggingFaceParser._metrics` reads it: the line and a metric
    /// event, both waiting for a time like a `print`. Only the exact shape of `hf_dict` is read here.
    pub(super) fn hf_dict_line(&mut self, py: Python<'_>, l: LineAt<'_>) -> Result<bool, GiveBack> {
        self.first_then_generic(self.c.huggingface, l.ids)?; // a dict of metrics always stops the parser loop
        let (si, text) = (l.si, l.text);
        // `_metrics` leaves a blob of 64 KiB or more to `_PAIR`; a message past the cap is cut: Python's
        if text.len() > self.cap || text.len() >= 65536 {
            return Err(GiveBack);
        }
        let metrics = hf_dict(text).ok_or(GiveBack)?;
        let msg = String::from_utf8(text.to_vec()).map_err(|_| GiveBack)?;
        self.check_room(si, 2)?;
        let (step, estimated) = {
            let st = self.streams[si].huggingface_state.bind(py);
            let n = get_int(st, "n")?;
            let mut dicts = get_int(st, "dicts")?;
            if metrics.iter().any(|(k, _)| k == "loss") {
                let d = dicts.unwrap_or(0).checked_add(1).ok_or(GiveBack)?;
                st.set_item("dicts", d).map_err(|_| GiveBack)?; // the last that can give the line back
                dicts = Some(d);
            }
            // the bar's count, else the count of loss dicts so far (marked estimated), else none
            match (n, dicts) {
                (Some(n), _) => (Some(n), false),
                (None, Some(d)) if d != 0 => (Some(d), true),
                _ => (None, false),
            }
        };
        self.counts.huggingface += 1;
        // the line itself first, as `_parse` adds it
        self.push_pending_all(si, vec![Pending::Print { msg }, Pending::DictMetric { metrics, step, estimated }]);
        Ok(true)
    }
}
