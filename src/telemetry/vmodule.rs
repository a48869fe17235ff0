//! `--vmodule=pattern=N,...`: per-file verbosity, with klog's parsing, matching and errors.
//!
//! A pattern is matched against the base name of the call site's source file without `.rs`
//! (`controller` for `src/provision/controller.rs`), or else the last segment of its module
//! path. Without any of `\*?[]` it must be equal; otherwise Go's `filepath.Match` glob rules
//! apply. The first matching item decides.

use std::collections::HashSet;
use std::path::Path;

/// One `pattern=N` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VModuleItem {
    /// A file base name or glob.
    pub pattern: String,
    /// The `-v` level for call sites in matching files.
    pub level: u32,
}

/// One `--vmodule` value; repeated flags append.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VModuleList(pub Vec<VModuleItem>);

/// Parses one `--vmodule` value as component-base does, with its error texts: empty items are
/// skipped, each other item must be `pattern=N` with N a 31-bit unsigned integer.
pub fn parse_vmodule(text: &str) -> Result<VModuleList, String> {
    let mut items = Vec::new();
    for item in text.split(',').filter(|item| !item.is_empty()) {
        let (pattern, level) = match item.split('=').collect::<Vec<_>>()[..] {
            [pattern, level] if !pattern.is_empty() && !level.is_empty() => (pattern, level),
            _ => {
                return Err(format!(
                    "{} does not have the pattern=N format",
                    crate::gofmt::quote(item)
                ));
            }
        };
        let level = parse_uint31(level).map_err(|why| {
            format!(
                "parsing verbosity in {}: strconv.ParseUint: parsing {}: {why}",
                crate::gofmt::quote(item),
                crate::gofmt::quote(level)
            )
        })?;
        items.push(VModuleItem {
            pattern: pattern.to_owned(),
            level,
        });
    }
    Ok(VModuleList(items))
}

/// Go's `strconv.ParseUint(text, 10, 31)` and its two error reasons.
fn parse_uint31(text: &str) -> Result<u32, &'static str> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("invalid syntax");
    }
    match text.parse::<u64>() {
        Ok(value) if value < 1 << 31 => Ok(value as u32),
        _ => Err("value out of range"),
    }
}

/// The level of the first item matching a call site, from its source file or module path.
pub(crate) fn level_for(
    items: &[VModuleItem],
    file: Option<&str>,
    module_path: Option<&str>,
) -> Option<u32> {
    let stem = file
        .and_then(|file| Path::new(file).file_stem())
        .and_then(|stem| stem.to_str());
    let module = module_path.and_then(|path| path.rsplit("::").next());
    items
        .iter()
        .find(|item| {
            [stem, module]
                .into_iter()
                .flatten()
                .any(|name| matches(&item.pattern, name))
        })
        .map(|item| item.level)
}

/// klog: a literal compare unless the pattern has glob characters.
fn matches(pattern: &str, name: &str) -> bool {
    if pattern.contains(['\\', '*', '?', '[', ']']) {
        let pattern: Vec<char> = pattern.chars().collect();
        let name: Vec<char> = name.chars().collect();
        glob(&pattern, &name).unwrap_or(false)
    } else {
        pattern == name
    }
}

/// Go's `filepath.Match` on a base name (no separators): `*`, `?`, `[...]` with ranges and `^`
/// negation, `\` escapes. `None`: a malformed pattern, which klog treats as no match.
fn glob(pattern: &[char], name: &[char]) -> Option<bool> {
    glob_from(pattern, name, &mut HashSet::new())
}

/// `glob` remembering the (pattern rest, name rest) pairs, by length, known not to match: without
/// it each `*` retries every split below it, exponential in the number of stars (`*a*a*a*a*b`).
fn glob_from(
    pattern: &[char],
    name: &[char],
    failed: &mut HashSet<(usize, usize)>,
) -> Option<bool> {
    if failed.contains(&(pattern.len(), name.len())) {
        return Some(false);
    }
    let matched = glob_step(pattern, name, failed)?;
    if !matched {
        failed.insert((pattern.len(), name.len()));
    }
    Some(matched)
}

fn glob_step(
    pattern: &[char],
    name: &[char],
    failed: &mut HashSet<(usize, usize)>,
) -> Option<bool> {
    match pattern.split_first() {
        None => Some(name.is_empty()),
        Some(('*', rest)) => {
            // Try every split; a malformed rest is malformed whatever the split.
            for skip in 0..=name.len() {
                if glob_from(rest, &name[skip..], failed)? {
                    return Some(true);
                }
            }
            Some(false)
        }
        Some(('?', rest)) => match name.split_first() {
            Some((_, name_rest)) => glob_from(rest, name_rest, failed),
            None => Some(false),
        },
        Some(('[', rest)) => {
            let (matched, rest) = class(rest, name.first().copied())?;
            if !matched {
                return Some(false);
            }
            glob_from(rest, &name[1..], failed)
        }
        Some(('\\', rest)) => {
            let (&literal, rest) = rest.split_first()?;
            match name.split_first() {
                Some((&c, name_rest)) if c == literal => glob_from(rest, name_rest, failed),
                _ => Some(false),
            }
        }
        Some((&literal, rest)) => match name.split_first() {
            Some((&c, name_rest)) if c == literal => glob_from(rest, name_rest, failed),
            _ => Some(false),
        },
    }
}

/// A character class after its `[`: whether `c` is in it (false when there is no character),
/// and the pattern after its `]`.
fn class(pattern: &[char], c: Option<char>) -> Option<(bool, &[char])> {
    let (negated, mut rest) = match pattern.split_first() {
        Some(('^', rest)) => (true, rest),
        _ => (false, pattern),
    };
    let mut found = false;
    let mut first = true;
    loop {
        match rest.split_first() {
            None => return None,
            Some((']', after)) if !first => {
                rest = after;
                break;
            }
            _ => {}
        }
        first = false;
        let (lo, after) = class_char(rest)?;
        rest = after;
        let hi = match rest {
            ['-', after @ ..] => {
                let (hi, after) = class_char(after)?;
                rest = after;
                hi
            }
            _ => lo,
        };
        if c.is_some_and(|c| lo <= c && c <= hi) {
            found = true;
        }
    }
    Some((c.is_some() && found != negated, rest))
}

/// One character of a class, with `\` escapes; `-` and `]` must be escaped.
fn class_char(pattern: &[char]) -> Option<(char, &[char])> {
    match pattern {
        ['\\', c, rest @ ..] => Some((*c, rest)),
        ['-' | ']', ..] | [] => None,
        [c, rest @ ..] => Some((*c, rest)),
    }
}

#[cfg(test)]
#[path = "vmodule_props_tests.rs"]
mod props_tests;

#[cfg(test)]
#[path = "vmodule_tests.rs"]
mod tests;
