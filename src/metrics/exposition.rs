//! Exposition formats: Prometheus text 0.0.4 (what upstream always answers) by default, OpenMetrics
//! when the scraper asks for it.
//!
//! prometheus-client only writes OpenMetrics, and its encoder cannot be driven by another writer,
//! so the text format is rewritten from its output: one parse into families, then either format
//! written from them. Both name every sample alike, so a query sees the same series whichever
//! format Prometheus negotiated.
//!
//! prometheus-client ends every help it is given with a `.` of its own; it is taken off here, so
//! a family's help is exactly the string registered (upstream's, for upstream's families).
//! Collectors therefore write their help with a `.` appended, as the registry would.

use std::cmp::Ordering;
use std::fmt::Write as _;

/// What a scrape is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Prometheus text 0.0.4, as client_golang writes it.
    Text,
    /// OpenMetrics 1.0.0, as prometheus-client writes it.
    OpenMetrics,
}

impl Format {
    /// The Content-Type header of a body in this format.
    pub(crate) const fn content_type(self) -> &'static str {
        match self {
            // Every name we serve is a legacy Prometheus name, so no escaping ever happens.
            Self::Text => "text/plain; version=0.0.4; charset=utf-8; escaping=underscores",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics only if it is acceptable and weighs
    /// more than any text entry (`text/plain`, `text/*`, `*/*`); text otherwise, also when nothing
    /// we write is acceptable (client_golang's fallback too).
    pub(crate) fn negotiate(accept: Option<&str>) -> Self {
        let mut openmetrics = 0.0_f64;
        let mut text = 0.0_f64;
        for range in accept.unwrap_or_default().split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default().to_ascii_lowercase();
            let mut q = 1.0_f64;
            let mut version = None;
            for param in params {
                let Some((key, value)) = param.split_once('=') else {
                    continue;
                };
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => q = value.trim().parse().unwrap_or(0.0),
                    "version" => version = Some(value.trim().trim_matches('"').to_owned()),
                    _ => {}
                }
            }
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                // client_golang: `text/plain` matches without a version or with 0.0.4 only.
                "text/plain" if version.as_deref().is_none_or(|v| v == "0.0.4") => {
                    text = text.max(q);
                }
                "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics > text {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics output in `format`, families sorted by name as
/// client_golang's gatherer sorts them.
pub(crate) fn render(openmetrics: &str, format: Format) -> String {
    let mut families = parse(openmetrics);
    families.sort_by_key(Family::text_name);
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 8);
    for family in &families {
        match format {
            Format::OpenMetrics => family.write_openmetrics(&mut out),
            Format::Text => family.write_text(&mut out),
        }
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

/// One family as prometheus-client wrote it.
#[derive(Debug, Default)]
struct Family<'a> {
    /// The descriptor name (OpenMetrics: without a counter's `_total`).
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    /// The family's lines as written, descriptor included (the OpenMetrics body).
    lines: Vec<&'a str>,
    samples: Vec<TextSample<'a>>,
}

#[derive(Debug)]
struct TextSample<'a> {
    name: &'a str,
    /// (name, value as escaped in the exposition).
    labels: Vec<(&'a str, &'a str)>,
    value: &'a str,
}

fn parse(openmetrics: &str) -> Vec<Family<'_>> {
    let mut families: Vec<Family<'_>> = Vec::new();
    for line in openmetrics.lines() {
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = help.strip_suffix('.').unwrap_or(help);
            families.push(Family {
                name,
                help,
                ..Family::default()
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(family) = families.last_mut() {
                family.kind = rest.split_once(' ').map_or("unknown", |(_, kind)| kind);
            }
        } else if line.starts_with('#') {
            // `# UNIT` and anything else: OpenMetrics only, kept in its lines below.
        } else if let (Some(family), Some(sample)) = (families.last_mut(), parse_sample(line)) {
            family.samples.push(sample);
        }
        if let Some(family) = families.last_mut() {
            family.lines.push(line);
        }
    }
    families
}

/// `name{a="x",b="y"} value [# exemplar]`.
fn parse_sample(line: &str) -> Option<TextSample<'_>> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            inner = inner.trim_start_matches(',');
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after_key) = inner.split_once("=\"")?;
            let end = closing_quote(after_key)?;
            labels.push((key, &after_key[..end]));
            inner = &after_key[end + 1..];
        }
    }
    let value = rest.trim_start().split(' ').next()?;
    Some(TextSample {
        name,
        labels,
        value,
    })
}

/// The index of the quote ending an escaped label value.
fn closing_quote(value: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

impl Family<'_> {
    /// The name client_golang gives the family in text 0.0.4: counters keep `_total`.
    fn text_name(&self) -> String {
        match self.kind {
            "counter" if !self.name.ends_with("_total") => format!("{}_total", self.name),
            "info" => format!("{}_info", self.name),
            _ => self.name.to_owned(),
        }
    }

    fn write_openmetrics(&self, out: &mut String) {
        for line in &self.lines {
            if line.starts_with("# HELP ") {
                let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
            } else {
                let _ = writeln!(out, "{line}");
            }
        }
    }

    fn write_text(&self, out: &mut String) {
        let name = self.text_name();
        let kind = match self.kind {
            "counter" | "gauge" | "histogram" | "summary" => self.kind,
            "info" | "stateset" => "gauge",
            "gaugehistogram" => "histogram",
            _ => "untyped",
        };
        let _ = writeln!(out, "# HELP {name} {}", escape_help(self.help));
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let mut samples: Vec<&TextSample<'_>> = self
            .samples
            .iter()
            // Text 0.0.4 has no created timestamps.
            .filter(|s| !s.name.ends_with("_created"))
            .collect();
        // client_golang orders series by their label values, and within a histogram series the
        // buckets (by bound), then `_sum`, then `_count`.
        samples.sort_by(|a, b| {
            series_labels(a)
                .cmp(&series_labels(b))
                .then_with(|| suffix_rank(a.name).cmp(&suffix_rank(b.name)))
                .then_with(|| bound(a).partial_cmp(&bound(b)).unwrap_or(Ordering::Equal))
        });
        for sample in samples {
            out.push_str(sample.name);
            let mut labels: Vec<(&str, String)> = series_labels(sample)
                .into_iter()
                .map(|(k, v)| (k, v.to_owned()))
                .collect();
            for (key, value) in &sample.labels {
                if matches!(*key, "le" | "quantile") {
                    let value = value.parse().map_or_else(|_| (*value).to_owned(), go_float);
                    labels.push((key, value));
                }
            }
            if !labels.is_empty() {
                let pairs: Vec<String> =
                    labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                let _ = write!(out, "{{{}}}", pairs.join(","));
            }
            let value = sample
                .value
                .parse()
                .map_or_else(|_| sample.value.to_owned(), go_float);
            let _ = writeln!(out, " {value}");
        }
    }
}

/// The labels naming a sample's series, sorted by name (`le` and `quantile` excluded: client_golang
/// writes them last).
fn series_labels<'a>(sample: &TextSample<'a>) -> Vec<(&'a str, &'a str)> {
    let mut labels: Vec<(&str, &str)> = sample
        .labels
        .iter()
        .copied()
        .filter(|(k, _)| !matches!(*k, "le" | "quantile"))
        .collect();
    labels.sort_unstable();
    labels
}

fn suffix_rank(name: &str) -> u8 {
    match name.rsplit_once('_') {
        Some((_, "sum")) => 1,
        Some((_, "count")) => 2,
        _ => 0,
    }
}

fn bound(sample: &TextSample<'_>) -> f64 {
    sample
        .labels
        .iter()
        .find(|(k, _)| matches!(*k, "le" | "quantile"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

/// Text 0.0.4 escapes backslashes and line feeds in help.
fn escape_help(help: &str) -> String {
    help.replace('\\', r"\\").replace('\n', r"\n")
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, with client_golang's spellings of
/// the infinities: the shortest digits that read back as `v`, in exponent form when the decimal
/// exponent is below -4 or at least 6 (`1e-08`, `1e+06`, `0.005`, `100000`, `+Inf`).
pub(crate) fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` is the shortest round-trip form, e.g. `-9.999999999999999e-6`.
    let scientific = format!("{:e}", v.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let sign = if v < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exponent) {
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1;
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else {
        let point = point as usize;
        if point >= digits.len() {
            format!("{digits}{}", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;
