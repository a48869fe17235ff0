//! Go `fmt` renderings (`%q`, `%v` of maps and slices) so error messages match the upstream
//! sidecar byte for byte where users or scripts may match on them.

use std::collections::BTreeMap;
use std::fmt::Write;

/// Go `%q` of a string (`strconv.Quote`): double quotes, backslash escapes for `"`, `\` and
/// control characters; printable Unicode is kept as is.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_control() && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go `%q` of a `[]string`: `["a" "b"]`.
pub(crate) fn quote_list<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s.as_ref())).collect();
    format!("[{}]", quoted.join(" "))
}

/// Go `%v` of a `[]string`: `[a b]`.
pub(crate) fn list<S: AsRef<str>>(items: &[S]) -> String {
    let plain: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("[{}]", plain.join(" "))
}

/// Go `%v` of a `map[string]string` (keys sorted, as Go prints maps): `map[a:1 b:2]`; a nil or
/// empty map is `map[]`.
pub(crate) fn map(entries: Option<&BTreeMap<String, String>>) -> String {
    let body: Vec<String> = entries
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    format!("map[{}]", body.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_like_go() {
        assert_eq!(quote("a b"), r#""a b""#);
        assert_eq!(quote(r#"x"y\z"#), r#""x\"y\\z""#);
        assert_eq!(quote("tab\there\n"), r#""tab\there\n""#);
        assert_eq!(quote("\u{1}"), r#""\x01""#);
        assert_eq!(quote("zoné"), "\"zoné\"");
    }

    #[test]
    fn lists_and_maps_render_like_go() {
        assert_eq!(quote_list(&["pvc.foo", "bar"]), r#"["pvc.foo" "bar"]"#);
        assert_eq!(list(&["a", "b"]), "[a b]");
        let mut m = BTreeMap::new();
        m.insert("b".to_owned(), "2".to_owned());
        m.insert("a".to_owned(), "1".to_owned());
        assert_eq!(map(Some(&m)), "map[a:1 b:2]");
        assert_eq!(map(None), "map[]");
    }
}
