//! JSON text as orjson writes it: the compiled parts write lines byte for byte as the Python encoders do.

/// A JSON string of valid UTF-8 text, escaped as orjson escapes it.
pub(crate) fn json_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut start = 0;
    for (i, &c) in s.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            c if c < 0x20 => {
                out.extend_from_slice(&s[start..i]);
                out.extend_from_slice(format!("\\u{:04x}", c).as_bytes());
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// Whether `json_str` writes `s` as it is: no quote, backslash or control character in it (one pass without
/// early exit, which the compiler vectorises).
pub(crate) fn is_plain(s: &[u8]) -> bool {
    !s.iter().fold(false, |esc, &c| esc | (c < 0x20) | (c == b'"') | (c == b'\\'))
}

/// A JSON string of text known to need no escape (a name from a fixed set, a span id's hex digits): written
/// as it is, as `json_str` would write it (checked in debug builds; see `is_plain`).
pub(crate) fn plain_str(out: &mut Vec<u8>, s: &[u8]) {
    debug_assert!(is_plain(s), "text that needs escaping: {:?}", String::from_utf8_lossy(s));
    out.push(b'"');
    out.extend_from_slice(s);
    out.push(b'"');
}

/// A float as orjson writes it, where that is certain: shortest round-trip digits in
/// decimal notation, which orjson uses for magnitudes in [1e-5, 1e16); `None` elsewhere.
pub(crate) fn json_float(x: f64) -> Option<String> {
    let mut out = Vec::with_capacity(24);
    push_decimal(&mut out, x).then(|| String::from_utf8(out).expect("digits are ASCII"))
}

/// Whether orjson writes `x` in decimal notation: zero, or a magnitude in [1e-5, 1e16).
pub(crate) fn decimal_float(x: f64) -> bool {
    x == 0.0 || (1e-5..1e16).contains(&x.abs())
}

/// `json_float` appended to `out` without a String of its own (the drain writes many), or false.
fn push_decimal(out: &mut Vec<u8>, x: f64) -> bool {
    use std::io::Write;
    if !decimal_float(x) {
        return false;
    }
    let at = out.len();
    write!(out, "{}", x).expect("a Vec takes any write"); // shortest round-trip digits; zero as "0" or "-0"
    match out[at..].iter().position(|&b| b == b'.') {
        Some(dot) => even_on_a_tie(out, at, out.len() - at - dot - 1, x),
        None => out.extend_from_slice(b".0"),
    }
    true
}

/// Where `x` lies exactly halfway between two shortest forms (562949953421312.25: ...312.2 or ...312.3),
/// the standard library writes the upper one; orjson (ryu) and Python write the one ending in an even
/// digit. `out[at..]` holds `x` with `decimals` digits after the point. The check costs a few
/// instructions: a tie needs `x`'s exact binary fraction to have `decimals + 1` decimal digits, which
/// almost no measured value has.
fn even_on_a_tie(out: &mut Vec<u8>, at: usize, decimals: usize, x: f64) {
    let bits = x.to_bits();
    let (biased, frac) = (((bits >> 52) & 0x7ff) as i32, bits & ((1u64 << 52) - 1));
    let (mant, exp) = if biased == 0 { (frac, -1074) } else { (frac | (1u64 << 52), biased - 1075) };
    if mant == 0 || -(exp + mant.trailing_zeros() as i32) != decimals as i32 + 1 {
        return; // not exactly representable in decimals + 1 digits: no tie
    }
    // exact: x with one more digit, a 5; the lower of the two forms is it without that digit
    let exact = format!("{:.*}", decimals + 1, x);
    let lower = &exact.as_bytes()[..exact.len() - 1];
    let last = lower[lower.len() - 1];
    if last.is_ascii_digit() && (last - b'0') % 2 == 0 && std::str::from_utf8(lower).ok().and_then(|t| t.parse().ok()) == Some(x) {
        out.truncate(at);
        out.extend_from_slice(lower);
    }
}

/// A field (`key` from `key!`) whose value is an integer.
pub(crate) fn int_field(out: &mut Vec<u8>, key: &[u8], v: i64) {
    out.extend_from_slice(key);
    push_int(out, v);
}

/// A field whose value is text, escaped here.
pub(crate) fn str_field(out: &mut Vec<u8>, key: &[u8], s: &[u8]) {
    out.extend_from_slice(key);
    json_str(out, s);
}

/// A field whose value is JSON written before (a cached name, an attributes object).
pub(crate) fn raw_field(out: &mut Vec<u8>, key: &[u8], json: &[u8]) {
    out.extend_from_slice(key);
    out.extend_from_slice(json);
}

pub(crate) fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(v).as_bytes());
}

/// Any finite float as the installed orjson writes it, or false. Decimal notation in [1e-5, 1e16);
/// outside it, the shortest round-trip digits in scientific notation, whose exponent's sign
/// orjson releases write differently (`1e16` before 3.13, `1e+16` since): `sci_plus` says
/// which (probed by the caller), `None` hands such a number back.
pub(crate) fn push_float(out: &mut Vec<u8>, x: f64, sci_plus: Option<bool>) -> bool {
    if push_decimal(out, x) {
        return true;
    }
    let Some(plus) = sci_plus else { return false };
    let s = format!("{:e}", x);
    match s.split_once('e') {
        Some((m, e)) if plus && !e.starts_with('-') => {
            out.extend_from_slice(m.as_bytes());
            out.extend_from_slice(b"e+");
            out.extend_from_slice(e.as_bytes());
        }
        _ => out.extend_from_slice(s.as_bytes()),
    }
    true
}

/// A 64-bit id as 16 lowercase hex digits, as Python's `"%016x"` writes it.
pub(crate) fn push_hex16(out: &mut Vec<u8>, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = [0u8; 16];
    for (i, d) in b.iter_mut().enumerate() {
        *d = HEX[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&b);
}
