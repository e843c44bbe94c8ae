//! Launcher prefixes: the `srun --label` rank (`" 3: "`) a line may start with, which names its stream.
//! Other prefixes (pdsh hosts, torchrun's `[default0]:`, mpirun's `[1,3]<stdout>:`) are the Python engine's.

use super::timestamps::num;
use super::{FastLane, GiveBack};

/// `" *(\d{1,6}): "` at the start: the rank and where the text starts.
fn srun_label(raw: &[u8]) -> Option<(u32, usize)> {
    let mut i = 0;
    while i < raw.len() && raw[i] == b' ' {
        i += 1;
    }
    let s = i;
    while i < raw.len() && raw[i].is_ascii_digit() && i - s < 7 {
        i += 1;
    }
    let nd = i - s;
    if nd == 0 || nd > 6 || !raw[i..].starts_with(b": ") {
        return None;
    }
    Some((num(&raw[s..i]) as u32, i + 2))
}

impl FastLane {
    /// The `srun` label of a clean UTF-8 line without NUL bytes (`None` without one) and the text after it.
    pub(super) fn split_label<'a>(&self, raw: &'a [u8]) -> Result<(Option<u32>, &'a [u8]), GiveBack> {
        if raw.contains(&0) || std::str::from_utf8(raw).is_err() {
            return Err(GiveBack);
        }
        Ok(match srun_label(raw).filter(|_| self.srun) {
            Some((r, at)) => (Some(r), &raw[at..]),
            None => (None, raw),
        })
    }

    /// Whether a line may carry mpirun's `--tag-output` tag (`[1,3]<stdout>:`, after `--timestamp-output`'s
    /// date): such a line is Python's (`ingest/_prefix.py` reads the tag), as `may_have_prefix` says there.
    pub(super) fn mpirun_tagged(text: &[u8]) -> bool {
        // a `]` then `<std`: memchr, not a memmem searcher (building one costs ~200 instructions a line)
        let head = &text[..text.len().min(48)];
        memchr::memchr_iter(b']', head).any(|i| head[i + 1..].starts_with(b"<std"))
    }

    /// The `srun` label a line starts with, whatever else it holds.
    pub(super) fn label_of(&self, raw: &[u8]) -> Option<u32> {
        if !self.srun {
            return None;
        }
        srun_label(raw).map(|(r, _)| r)
    }
}
