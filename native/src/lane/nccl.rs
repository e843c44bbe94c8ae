//! NCCL's debug lines (`NCCL_DEBUG=INFO`: `host:pid:tid [dev] NCCL INFO …`), as
//! `ingest/parsers/torch_distributed.py` reads them: a log event each, waiting for a time (they have none).

use super::pending::Pending;
use super::{FastLane, GiveBack};

/// An NCCL debug line (`ncclDebugLogV`) as `ingest/parsers/torch_distributed.py`'s `_NCCL` reads it.
struct NcclLine<'a> {
    host: &'a str,
    pid: i64,
    tid: i64,
    dev: i64,
    src: Option<(&'a str, &'a str)>,
    lvl: &'a str,
    msg: &'a str,
}

/// `_NCCL` (`host:pid:tid [dev] (file:line ((func) )?)?NCCL LVL ?msg`) matched at the start of ASCII `t`; where
/// it does not match there, Python's search may find it further on: `None` (the line is given back). Each
/// part stops where the next must start, so the first way Python's backtracking tries is the one that matches,
/// except the optional source part, tried first and dropped when "NCCL" does not follow it.
fn nccl_at_start(t: &str) -> Option<NcclLine<'_>> {
    let b = t.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let run = |mut i: usize, f: &dyn Fn(u8) -> bool| {
        while i < b.len() && f(b[i]) {
            i += 1;
        }
        i
    };
    let h = run(0, &|c| word(c) || c == b'.' || c == b'-');
    if h == 0 || b.get(h) != Some(&b':') {
        return None;
    }
    let p = run(h + 1, &|c| c.is_ascii_digit());
    if p == h + 1 || b.get(p) != Some(&b':') || p - h > 18 {
        return None;
    }
    let q = run(p + 1, &|c| c.is_ascii_digit());
    if q == p + 1 || !t[q..].starts_with(" [") || q - p > 18 {
        return None;
    }
    let d0 = if b.get(q + 2) == Some(&b'-') { q + 3 } else { q + 2 };
    let d = run(d0, &|c| c.is_ascii_digit());
    if d == d0 || !t[d..].starts_with("] ") || d - d0 > 18 {
        return None;
    }
    let mut i = d + 2;
    let mut src = None;
    // (?:(file):(line) (?:\((func)\) )?)?
    let f = run(i, &|c| word(c) || matches!(c, b'.' | b'/' | b'-'));
    if f > i && b.get(f) == Some(&b':') {
        let l = run(f + 1, &|c| c.is_ascii_digit());
        if l > f + 1 && b.get(l) == Some(&b' ') {
            let mut j = l + 1;
            if b.get(j) == Some(&b'(') {
                if let Some(k) = t[j + 1..].find(')') {
                    if b.get(j + 1 + k + 1) == Some(&b' ') && t[j + 1 + k + 2..].starts_with("NCCL ") {
                        j = j + 1 + k + 2;
                    }
                }
            }
            if t[j..].starts_with("NCCL ") {
                src = Some((&t[i..f], &t[f + 1..l]));
                i = j;
            }
        }
    }
    let rest = t[i..].strip_prefix("NCCL ")?;
    let lvl = ["INFO", "WARN", "TRACE", "CALL", "ABORT"].into_iter().find(|l| rest.starts_with(l))?;
    let mut m = &rest[lvl.len()..];
    if let Some(x) = m.strip_prefix(' ') {
        m = x;
    }
    Some(NcclLine {
        host: &t[..h],
        pid: t[h + 1..p].parse().ok()?,
        tid: t[p + 1..q].parse().ok()?,
        dev: t[q + 2..d].parse().ok()?,
        src,
        lvl,
        msg: m,
    })
}

impl FastLane {
    /// An NCCL line that `_NCCL` matches at its start: its log event, pending.
    pub(super) fn nccl_line(&mut self, si: usize, text: &[u8]) -> Result<bool, GiveBack> {
        if !text.is_ascii() {
            return Err(GiveBack); // `\w` and friends differ between Python and Rust outside ASCII
        }
        let t = std::str::from_utf8(text).map_err(|_| GiveBack)?;
        let c = nccl_at_start(t).ok_or(GiveBack)?;
        if c.msg.len() > self.cap {
            return Err(GiveBack);
        }
        let level = match c.lvl {
            "WARN" | "ABORT" => "WARNING",
            "TRACE" | "CALL" => "DEBUG",
            _ => "INFO",
        };
        let p = Pending::Nccl {
            level,
            msg: c.msg.to_string(),
            host: c.host.to_string(),
            pid: c.pid,
            tid: c.tid,
            dev: c.dev,
            src: c.src.map(|(f, l)| format!("{f}:{l}")),
        };
        let taken = self.push_pending(si, p)?;
        self.counts.nccl += 1;
        Ok(taken)
    }
}
