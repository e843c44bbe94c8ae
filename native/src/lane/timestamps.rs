//! The dates and times of the heads the lane reads (`ingest/_timestamps.py`'s rules): digits, calendar days,
//! seconds of the day, fractions, and the UTC nanoseconds they make in the ingest's time zone.

/// The nanoseconds of one fraction digit, by the number of digits (`frac_ns`).
const FRAC_SCALE: [i64; 10] = [0, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1];

/// Whether `t[from..from + n]` is there and all ASCII digits.
pub(super) fn digits(t: &[u8], from: usize, n: usize) -> bool {
    t.len() >= from + n && t[from..from + n].iter().all(u8::is_ascii_digit)
}

/// The number ASCII digits `b` write (checked by the caller; at most 18, so it fits).
pub(super) fn num(b: &[u8]) -> i64 {
    b.iter().fold(0i64, |a, &c| a * 10 + (c - b'0') as i64)
}

/// The epoch day of a date of the proleptic Gregorian calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Epoch day of `YYYY-MM-DD` and second of day of `HH:MM:SS`, as `datetime.date` and
/// `_hms` accept them (a leap second included); `None` for an invalid one.
pub(super) fn day_and_second(date: &[u8], tod: &[u8]) -> Option<(i64, i64)> {
    let (y, m, d) = (num(&date[0..4]), num(&date[5..7]), num(&date[8..10]));
    if y < 1 || !(1..=12).contains(&m) || d < 1 {
        return None;
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let dim = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][(m - 1) as usize];
    if d > dim {
        return None;
    }
    let (h, mi, s) = (num(&tod[0..2]), num(&tod[3..5]), num(&tod[6..8]));
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some((days_from_civil(y, m, d), h * 3600 + mi * 60 + s))
}

/// UTC nanoseconds of a day, second of day and fraction digits (at most 9; none is 0) read in a zone
/// `tz_offset_s` east of UTC.
pub(super) fn utc_ns(day: i64, sod: i64, frac: &[u8], tz_offset_s: i64) -> i64 {
    (day * 86400 + sod - tz_offset_s) * 1_000_000_000 + num(frac) * FRAC_SCALE[frac.len()]
}

/// Whether a head layout of `ingest/_timestamps.py` may start with this character (its `_BY_FIRST`).
pub(super) fn may_have_head(c: u8) -> bool {
    c.is_ascii_digit() || matches!(c, b'[' | b' ' | b'I' | b'W' | b'E' | b'F' | b'D' | b'C' | b'A' | b'J' | b'M' | b'N' | b'O' | b'S')
}
