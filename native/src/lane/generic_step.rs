//! The generic step parser's lines (`ingest/parsers/generic.py`): `step 12 loss 2.31 lr 3e-4 time 812ms
//! (forward 300ms backward 420ms allreduce 60ms)` after a strict Python `logging` head: the step (`_STEP`),
//! the `key value[unit]` pairs (`_PAIR`) and what each key is (`_role`, asked of Python once per key and
//! unit), and the events: the line's log, the metrics, the step span and its phases.

use pyo3::prelude::*;

use super::python_logging::{strict_head, Head};
use super::stream::LAYOUT_ISO;
use super::timestamps::num;
use super::{metric_value, FastLane, GiveBack, LineAt, Moment};
use crate::line_writer::{layout_span, log_event, step_metric, step_span, LayoutSpan, StepSpan};

/// The units a pair may have (`_PAIR`'s `unit` group); a role is cached by key and unit (0: none, then these + 1).
const UNITS: [&str; 8] = ["ms", "s", "us", "µs", "sec", "secs", "seconds", "msec"];

/// What `_role(key, unit)` makes of a pair: nothing, a metric, the step's duration, a phase or a collective
/// (with the scale to ns).
#[derive(Clone)]
pub(super) enum Role {
    Ignore,
    Metric(String),
    StepDur(f64),
    Phase(String, f64),
    Collective(String, f64),
    /// A duration reported as a metric (`round(ns / 1e6, 6)`): left to Python.
    Other,
}

/// The generic parser's `_STEP` searched in printable-ASCII `text`:
/// `(?i)\b(global_step|step|iter|iteration)\b\s*[=:#]?\s*\[?(\d+)(?:\s*/\s*\d+)?`; `(step, end of match)`.
///
/// At each word start the names are tried in the pattern's order; after a name, the blanks, the separator
/// and the bracket are optional parts that only the greedy way can get past to a digit.
pub(super) fn find_step(text: &str) -> Result<Option<(i64, usize)>, GiveBack> {
    let t = text.as_bytes();
    let n = t.len();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let blank = |i: usize| matches!(t.get(i), Some(b' ') | Some(b'\t'));
    for s in 0..n {
        if !t[s].is_ascii_alphabetic() || (s > 0 && word(t[s - 1])) {
            continue;
        }
        for name in ["global_step", "step", "iter", "iteration"] {
            let e = s + name.len();
            if e > n || !t[s..e].eq_ignore_ascii_case(name.as_bytes()) || (e < n && word(t[e])) {
                continue;
            }
            let mut j = e;
            while blank(j) {
                j += 1;
            }
            if matches!(t.get(j), Some(b'=') | Some(b':') | Some(b'#')) {
                j += 1;
            }
            while blank(j) {
                j += 1;
            }
            if t.get(j) == Some(&b'[') {
                j += 1;
            }
            let d0 = j;
            while j < n && t[j].is_ascii_digit() {
                j += 1;
            }
            if j == d0 {
                continue;
            }
            if j - d0 > 18 {
                return Err(GiveBack); // past i64: Python's int is exact there
            }
            let step = num(&t[d0..j]);
            let mut k = j;
            while blank(k) {
                k += 1;
            }
            let mut end = j;
            if t.get(k) == Some(&b'/') {
                k += 1;
                while blank(k) {
                    k += 1;
                }
                let k0 = k;
                while k < n && t[k].is_ascii_digit() {
                    k += 1;
                }
                if k > k0 {
                    end = k;
                }
            }
            return Ok(Some((step, end)));
        }
    }
    Ok(None)
}

/// One `key value[unit]` pair of a generic step line, as byte ranges of the text.
pub(super) struct Pair {
    key: (usize, usize),
    val: (usize, usize),
    unit: Option<&'static str>,
    end: usize,
}

/// `\w` of ASCII text.
pub(super) fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The first number of `[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf|Infinity` at `v`, taking
/// each part as Python's backtracking first tries it (greedy); its end, or `None`.
fn number_at(t: &[u8], v: usize) -> Option<usize> {
    let digit = |i: usize| t.get(i).is_some_and(u8::is_ascii_digit);
    let mut q = v;
    if matches!(t.get(q), Some(b'+') | Some(b'-')) {
        q += 1;
    }
    let mut ok = false;
    if digit(q) {
        while digit(q) {
            q += 1;
        }
        if t.get(q) == Some(&b'.') {
            q += 1;
            while digit(q) {
                q += 1;
            }
        }
        ok = true;
    } else if t.get(q) == Some(&b'.') && digit(q + 1) {
        q += 1;
        while digit(q) {
            q += 1;
        }
        ok = true;
    }
    if ok {
        if matches!(t.get(q), Some(b'e') | Some(b'E')) {
            let mut r = q + 1;
            if matches!(t.get(r), Some(b'+') | Some(b'-')) {
                r += 1;
            }
            if digit(r) {
                while digit(r) {
                    r += 1;
                }
                q = r;
            }
        }
        return Some(q);
    }
    ["nan", "NaN", "inf", "-inf", "Infinity"].iter().find(|w| t[v..].starts_with(w.as_bytes())).map(|w| v + w.len())
}

/// The generic parser's `_PAIR` searched in printable-ASCII `text` from `at`, as Python's `re` finds it:
/// `(?<![\w./-])[-./]*(?P<key>[A-Za-z_][\w./-]*)(?:=|:?\s+)\[?(?P<val>number)\s?(?P<unit>ms|s|…)?(?![\w.])`.
///
/// Each part has one way to match that can lead anywhere (the key stops where the separator must start,
/// and so on), so the first way Python tries is the only one, except in the tail: there the blank, the
/// unit and the look-ahead are tried in Python's order. Where the tail fails every way, Python would go
/// back into the number; such a line is given back.
pub(super) fn next_pair(text: &str, at: usize) -> Result<Option<Pair>, GiveBack> {
    let t = text.as_bytes();
    let n = t.len();
    let blank = |i: usize| matches!(t.get(i), Some(b' ') | Some(b'\t'));
    let keyish = |c: u8| is_word(c) || matches!(c, b'.' | b'/' | b'-');
    let mut next = at;
    while next < n {
        let s = next;
        next += 1;
        if !(t[s].is_ascii_alphabetic() || t[s] == b'_') {
            continue;
        }
        // `(?<![\w./-])[-./]*`: a key starts only where its run of key characters starts (after `--`
        // and the like), so a failed key skips its whole run: linear on any line.
        let mut b = s;
        while b > at && matches!(t[b - 1], b'.' | b'/' | b'-') {
            b -= 1;
        }
        let mut k = s + 1;
        while k < n && keyish(t[k]) {
            k += 1;
        }
        next = k;
        if b > 0 && keyish(t[b - 1]) {
            continue;
        }
        let mut p = k;
        if t.get(p) == Some(&b'=') {
            p += 1;
        } else {
            if t.get(p) == Some(&b':') && blank(p + 1) {
                p += 1;
            }
            if !blank(p) {
                continue;
            }
            while blank(p) {
                p += 1;
            }
        }
        if t.get(p) == Some(&b'[') {
            p += 1;
        }
        let Some(v_end) = number_at(t, p) else { continue };
        let mut tail = None;
        'tail: for w in if blank(v_end) { &[1usize, 0][..] } else { &[0usize][..] } {
            let q = v_end + w;
            for u in UNITS {
                if text[q..].starts_with(u) && !word_follows(text, q + u.len()) {
                    tail = Some((q + u.len(), Some(u)));
                    break 'tail;
                }
            }
            if !word_follows(text, q) {
                tail = Some((q, None));
                break;
            }
        }
        let Some((end, unit)) = tail else { return Err(GiveBack) };
        return Ok(Some(Pair { key: (s, k), val: (p, v_end), unit, end }));
    }
    Ok(None)
}

/// Whether `(?![\w.])` fails at byte `at` of ASCII `text`.
fn word_follows(text: &str, at: usize) -> bool {
    text.as_bytes().get(at).is_some_and(|&c| c == b'.' || c == b'_' || c.is_ascii_alphanumeric())
}

/// `float()` of what the pair pattern admits.
fn py_float(raw: &str) -> Option<f64> {
    match raw {
        "nan" | "NaN" => Some(f64::NAN),
        "inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => raw.parse::<f64>().ok(),
    }
}

impl FastLane {
    /// `_role(key, unit)`, cached (Python's answer does not change during an ingest).
    fn role(&mut self, py: Python<'_>, key: &str, unit: Option<&str>) -> Result<Role, GiveBack> {
        let u = match unit {
            None => 0,
            Some(u) => 1 + UNITS.iter().position(|x| *x == u).ok_or(GiveBack)?,
        };
        if let Some(Some(r)) = self.roles.get(key).map(|slots| &slots[u]) {
            return Ok(r.clone());
        }
        let res = self.role_fn.call1(py, (key, unit)).map_err(|_| GiveBack)?;
        let (role, name, scale): (Option<String>, String, f64) = res.extract(py).map_err(|_| GiveBack)?;
        let r = match role.as_deref() {
            None => Role::Ignore,
            Some("metric") => Role::Metric(name),
            Some("step") => Role::StepDur(scale),
            Some("phase") => Role::Phase(name, scale),
            Some("collective") => Role::Collective(name, scale),
            Some(_) => Role::Other,
        };
        if self.roles.len() < 4096 {
            self.roles.entry(key.to_string()).or_default()[u] = Some(r.clone());
        }
        Ok(r)
    }

    /// A step line of the generic parser (`ingest/parsers/generic.py`), for the lines whose every pair
    /// it can write exactly; its events spliced as the Python engine's `_write` encodes them.
    pub(super) fn step_line(&mut self, py: Python<'_>, l: LineAt<'_>, (ts, day): (i64, i64), h: &Head<'_>) -> Result<bool, GiveBack> {
        let (si, body) = (l.si, &l.text[h.body_at..]);
        // Outside printable ASCII (and tab), `\w`, `\s` and case folding differ between Python and Rust.
        if body.len() > self.cap || !body.iter().all(|&c| (0x20..0x7f).contains(&c) || c == b'\t') {
            return Err(GiveBack);
        }
        let text = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        let (step, after) = find_step(text)?.ok_or(GiveBack)?;
        let mut metrics: Vec<(String, f64)> = Vec::new();
        let mut phases: Vec<(String, bool, i64)> = Vec::new();
        let mut step_ns: Option<i64> = None;
        let mut at = after;
        while let Some(pair) = next_pair(text, at)? {
            at = pair.end;
            let (key, raw, unit) = (&text[pair.key.0..pair.key.1], &text[pair.val.0..pair.val.1], pair.unit);
            let value = py_float(raw).ok_or(GiveBack)?;
            match self.role(py, key, unit)? {
                Role::Ignore => {}
                Role::Other => return Err(GiveBack),
                Role::Metric(name) => {
                    let v = metric_value(value)?;
                    match metrics.iter_mut().find(|(k, _)| *k == name) {
                        Some(e) => e.1 = v,
                        None => metrics.push((name, v)),
                    }
                }
                Role::StepDur(scale) | Role::Phase(_, scale) | Role::Collective(_, scale)
                    if value.is_nan() || value.abs() >= 1e12 || value * scale <= -1.0 =>
                {
                    let _ = scale; // `int(value * scale)` is None or negative: the pair is skipped
                }
                Role::StepDur(scale) | Role::Phase(_, scale) | Role::Collective(_, scale)
                    if (value * scale).abs() >= 9e18 =>
                {
                    let _ = scale;
                    return Err(GiveBack); // past i64: Python's int is exact there
                }
                Role::StepDur(scale) => step_ns = Some((value * scale) as i64),
                Role::Phase(name, scale) => phases.push((name, false, (value * scale) as i64)),
                Role::Collective(name, scale) => phases.push((name, true, (value * scale) as i64)),
            }
        }
        if metrics.is_empty() && phases.is_empty() && step_ns.is_none() {
            return Err(GiveBack);
        }
        if step_ns.is_none() && !phases.is_empty() {
            step_ns = Some(phases.iter().map(|p| p.2).sum());
        }
        let Some(step_ns) = step_ns else { return Err(GiveBack) }; // from the previous step line: Python's
        // Nothing can be given back from here on: state and output change.
        {
            let st = self.streams[si].generic_state.bind(py);
            st.set_item("step", step).map_err(|_| GiveBack)?;
            st.set_item("ts", ts).map_err(|_| GiveBack)?;
        }
        let mut ids = Vec::new();
        if step_ns > 0 {
            ids.push(self.new_span_id());
            for p in &phases {
                if p.2 > 0 {
                    ids.push(self.new_span_id());
                }
            }
        }
        let kept = || phases.iter().filter(|p| p.2 > 0);
        let t = self.write_dated(si, ts, ("iso", day), LAYOUT_ISO, |buf, open, offset| {
            let t = ts + offset;
            log_event(buf, open, h.level, body, Some(h.logger), t, false); // the line itself, as `_parse` adds it
            if !metrics.is_empty() {
                step_metric(buf, open, step, &metrics, t, false);
            }
            if step_ns > 0 {
                let parent = &ids[0];
                step_span(buf, open, &StepSpan { step, dur: step_ns, id: parent, source: "log", end: t }, true, false);
                let mut rel = -kept().map(|p| p.2).sum::<i64>();
                for ((name, coll, dur), id) in kept().zip(&ids[1..]) {
                    let span = LayoutSpan {
                        cat: if *coll { "collective" } else { "phase" },
                        name,
                        step,
                        start: ts + rel + offset,
                        dur: *dur,
                        id,
                        parent: Some(parent),
                        collective: coll.then_some((name.as_str(), "log")),
                    };
                    layout_span(buf, open, &span, true);
                    rel += dur;
                }
            }
        });
        let mut spans = 0;
        if step_ns > 0 {
            spans = 1 + kept().count() as u64; // the step's and its phases'
            self.sync.push((l.label, step, t));
        }
        self.counts.logs += 1;
        self.counts.metrics += !metrics.is_empty() as u64;
        self.counts.spans += spans;
        self.counts.generic += 1;
        Ok(true)
    }

    /// A clock-alignment moment of a strict-head line whose only sync parser is the generic one, read as
    /// `GenericStepParser.sync_step` reads it; `Ok(None)`: not a moment.
    pub(super) fn generic_moment(&mut self, label: Option<u32>, text: &[u8]) -> Result<Option<Moment>, GiveBack> {
        let h = strict_head(text).ok_or(GiveBack)?;
        let (ts, day) = self.stamp(&h).ok_or(GiveBack)?;
        let body = &text[h.body_at..];
        if !body.iter().all(|&c| (0x20..0x7f).contains(&c) || c == b'\t') {
            return Err(GiveBack);
        }
        let text = std::str::from_utf8(body).map_err(|_| GiveBack)?;
        self.sync_days.insert(label, ("iso", day));
        self.sync_layouts.insert(label, LAYOUT_ISO);
        let Some((step, after)) = find_step(text)? else { return Ok(None) };
        Ok(next_pair(text, after)?.map(|_| (label, step, ts)))
    }
}
