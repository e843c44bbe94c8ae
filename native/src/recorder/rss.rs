//! Host RSS at step ends, read from `/proc/self/statm`.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Host RSS at step ends, at most once per interval (`_torch.memory_hook`'s rule, without its Python call).
pub(super) struct Rss {
    pub(super) statm: File,
    pub(super) interval_ns: i64,
    pub(super) next_ns: i64,
    pub(super) page: i64,
}

impl Rss {
    pub(super) fn open(interval_ns: i64, page: i64) -> Option<Rss> {
        let statm = File::open("/proc/self/statm").ok()?;
        Some(Rss { statm, interval_ns, next_ns: 0, page })
    }

    pub(super) fn read(&self) -> Option<i64> {
        let mut buf = [0u8; 128];
        let n = self.statm.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let pages: i64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
        Some(pages * self.page)
    }
}
