//! Small helpers: timestamps, resource quantities, name suffixes, base64 for continue tokens.

use serde_json::Value;

/// `metav1.Time`: RFC 3339 in UTC with whole seconds.
pub fn now() -> String {
    let t = jiff::Timestamp::now();
    jiff::Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

/// Parses a resource quantity (`10Gi`, `1G`, `500M`, `1.5e3`, `100m`) into bytes/units.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        s if s.starts_with('e') || s.starts_with('E') => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

pub fn quantity_at(v: &Value, ptr: &str) -> Option<f64> {
    match v.pointer(ptr)? {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Five characters as the real `generateName` appends.
pub fn name_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = B64.iter().position(|x| *x == c)? as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi"), Some(1073741824.0));
        assert_eq!(parse_quantity("500M"), Some(5e8));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("x"), None);
    }

    #[test]
    fn base64_round_trip() {
        for s in [
            "",
            "a",
            "ab",
            "abc",
            "{\"rv\":12,\"start\":\"ns/name\\u0000\"}",
        ] {
            assert_eq!(b64_decode(&b64_encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(b64_encode(b"ab"), "YWI=");
    }
}
