//! Go renderings and parsings: `fmt`'s `%q` and `%v` of maps and slices, `time.Duration` (parse and
//! print) and `strconv.ParseBool`, so flags read and messages print byte for byte as upstream's,
//! where users or scripts may match on them.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaimStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
    list(&items.iter().map(|s| quote(s.as_ref())).collect::<Vec<_>>())
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

/// Go `%v` of a `PersistentVolumeClaimStatus` value, as upstream prints a clone source that is
/// not Bound (`Got {Pending [] map[] [] map[] map[] <nil> nil}`): phase, access modes, capacity,
/// conditions, allocated resources and their statuses, the current VolumeAttributesClass (a
/// pointer: Go prints its address, shown here as `0xc000000000`) and the modify status.
pub(crate) fn claim_status(status: Option<&PersistentVolumeClaimStatus>) -> String {
    let default = PersistentVolumeClaimStatus::default();
    let s = status.unwrap_or(&default);
    let conditions: Vec<String> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            let time = |t: &Option<Time>| {
                t.as_ref()
                    .map_or("0001-01-01 00:00:00 +0000 UTC".to_owned(), |t| {
                        t.0.strftime("%Y-%m-%d %H:%M:%S +0000 UTC").to_string()
                    })
            };
            format!(
                "{{{} {} {} {} {} {}}}",
                c.type_,
                c.status,
                time(&c.last_probe_time),
                time(&c.last_transition_time),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let statuses: BTreeMap<String, String> = s
        .allocated_resource_statuses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    format!(
        "{{{} {} {} {} {} {} {} {}}}",
        s.phase.as_deref().unwrap_or_default(),
        list(s.access_modes.as_deref().unwrap_or_default()),
        resource_list(s.capacity.as_ref()),
        list(&conditions),
        resource_list(s.allocated_resources.as_ref()),
        map(Some(&statuses)),
        if s.current_volume_attributes_class_name.is_some() {
            "0xc000000000"
        } else {
            "<nil>"
        },
        match &s.modify_volume_status {
            None => "nil".to_owned(),
            Some(m) => format!(
                "&ModifyVolumeStatus{{TargetVolumeAttributesClassName:{},Status:{},}}",
                m.target_volume_attributes_class_name
                    .as_deref()
                    .unwrap_or_default(),
                m.status
            ),
        }
    )
}

/// Go `%v` of a `ResourceList` (a map of `resource.Quantity` values, printed field by field:
/// `map[storage:{{1073741824 0} {<nil>} 1Gi BinarySI}]`).
fn resource_list(list: Option<&BTreeMap<String, Quantity>>) -> String {
    let entries: BTreeMap<String, String> = list
        .into_iter()
        .flatten()
        .map(|(k, q)| (k.clone(), quantity_fields(&q.0)))
        .collect();
    map(Some(&entries))
}

/// The fields of a parsed `resource.Quantity`: `{{value scale} {<nil>} text format}` for the
/// integer forms (`1Gi`, `2G`, `100`); anything else is shown as its text.
fn quantity_fields(text: &str) -> String {
    // Suffix i (from 0) is 2^(10(i+1)) in BINARY, 10^(3(i+1)) in DECIMAL.
    const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    const DECIMAL: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, suffix) = text.split_at(digits);
    let Ok(n) = number.parse::<i64>() else {
        return text.to_owned();
    };
    if let Some(i) = BINARY.iter().position(|s| *s == suffix) {
        if let Some(v) = n.checked_mul(1i64 << (10 * (i + 1))) {
            return format!("{{{{{v} 0}} {{<nil>}} {text} BinarySI}}");
        }
    } else if let Some(i) = DECIMAL.iter().position(|s| *s == suffix) {
        return format!("{{{{{n} {}}} {{<nil>}} {text} DecimalSI}}", 3 * (i + 1));
    } else if suffix.is_empty() {
        return format!("{{{{{n} 0}} {{<nil>}} {text} DecimalSI}}");
    }
    text.to_owned()
}

/// Parses a boolean as Go's `strconv.ParseBool` does.
pub(crate) fn parse_go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "invalid boolean {text:?} (use true or false; 1, t, T, TRUE, True, 0, f, F, FALSE, False also work)"
        )),
    }
}

/// Parses a duration as Go's `time.ParseDuration` does (`300ms`, `1.5h`, `1m30s`, `0`), except
/// that negative durations are rejected: no flag of this program has a meaning for them.
pub(crate) fn parse_go_duration(text: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u128); 9] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("μs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
        ("", 0),
    ];
    let invalid =
        |why: &str| format!("invalid duration {text:?}: {why} (examples: 15s, 5m, 1m30s, 300ms)");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("empty"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after_int) = rest.split_at(int_len);
        let (frac_part, after_number) = match after_int.strip_prefix('.') {
            Some(after_dot) => {
                let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
                after_dot.split_at(frac_len)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid("expected a number"));
        }
        let unit_len = after_number
            .char_indices()
            .find(|&(_, c)| c == '.' || c.is_ascii_digit())
            .map_or(after_number.len(), |(i, _)| i);
        let (unit, after_unit) = after_number.split_at(unit_len);
        let scale = match UNITS.iter().find(|(name, _)| *name == unit) {
            Some((_, 0)) => return Err(invalid("missing unit")),
            Some((_, scale)) => *scale,
            None => {
                return Err(invalid(&format!(
                    "unknown unit {unit:?} (use ns, us, ms, s, m or h)"
                )));
            }
        };
        let int: u128 = match int_part {
            "" => 0,
            digits => digits.parse().map_err(|_| invalid("out of range"))?,
        };
        // Digits past the 18th are below a nanosecond for every unit, so they are dropped.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = match frac_digits {
            "" => 0,
            digits => digits.parse().map_err(|_| invalid("bad fraction"))?,
        };
        let frac_ns = frac * scale / 10u128.pow(frac_digits.len() as u32);
        total = int
            .checked_mul(scale)
            .and_then(|v| v.checked_add(frac_ns))
            .and_then(|v| v.checked_add(total))
            .filter(|&v| v <= i64::MAX as u128)
            .ok_or_else(|| invalid("out of range"))?;
        rest = after_unit;
    }
    if negative && total > 0 {
        return Err(invalid("negative durations are not allowed"));
    }
    let secs = (total / 1_000_000_000) as u64;
    let nanos = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

/// Formats a duration as Go's `time.Duration.String` does (`5m0s`, `1.5s`, `300ms`), so that
/// messages quote values the way users wrote them in manifests.
pub(crate) fn format_go_duration(duration: Duration) -> String {
    fn trimmed(whole: u128, frac: u128, frac_digits: u32) -> String {
        let frac = format!("{frac:0width$}", width = frac_digits as usize);
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{frac}")
        }
    }
    let ns = duration.as_nanos();
    if ns == 0 {
        return "0s".to_owned();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", trimmed(ns / 1_000, ns % 1_000, 3));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", trimmed(ns / 1_000_000, ns % 1_000_000, 6));
    }
    let hours = ns / 3_600_000_000_000;
    let minutes = ns / 60_000_000_000 % 60;
    let seconds = trimmed(ns / 1_000_000_000 % 60, ns % 1_000_000_000, 9);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

#[cfg(test)]
#[path = "gofmt_tests.rs"]
mod tests;
