//! Reading a metrics endpoint as Prometheus does: one scrape with a chosen `Accept` header, and the
//! families it serves (name, type, label names), in either text format.

use std::collections::{BTreeMap, BTreeSet};

/// What Prometheus 2 and 3 send by default (OpenMetrics preferred).
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// One scrape of `http://{addr}{path}`: (Content-Type, body), or `None` when nothing answers.
pub async fn scrape(addr: &str, path: &str, accept: Option<&str>) -> Option<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {path} HTTP/1.0\r\nHost: sidecar\r\n{accept}\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.ok()?;
    let response = String::from_utf8(response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.") || head.split(' ').nth(1) != Some("200") {
        return None;
    }
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Some((content_type, body.to_owned()))
}

/// A served family: its type and the label names of its series (`le`/`quantile` left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub kind: String,
    pub labels: BTreeSet<String>,
}

/// The families of a scrape that have at least one sample, by the name a query uses for the
/// family in text 0.0.4 (OpenMetrics counters are renamed to their `_total` sample name, so both
/// formats give the same map). Sample names of a family are listed by [`sample_names`].
pub fn families(body: &str) -> BTreeMap<String, Family> {
    let mut declared: Vec<(String, String)> = Vec::new();
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line has a type");
            declared.push((name.to_owned(), kind.to_owned()));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name, kind)) = declared.last() else {
            continue;
        };
        let sample = line.split(['{', ' ']).next().unwrap_or_default();
        if sample.ends_with("_created") {
            continue;
        }
        let family = match kind.as_str() {
            "counter" if !name.ends_with("_total") => format!("{name}_total"),
            _ => name.clone(),
        };
        let entry = out.entry(family).or_insert_with(|| Family {
            kind: kind.clone(),
            labels: BTreeSet::new(),
        });
        entry.labels.extend(label_names(line));
    }
    out
}

/// The label names of one sample line, `le` and `quantile` left out.
pub fn label_names(line: &str) -> Vec<String> {
    let Some(start) = line.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = &line[start + 1..];
    loop {
        rest = rest.trim_start_matches(',');
        if rest.starts_with('}') || rest.is_empty() {
            break;
        }
        let Some((name, after)) = rest.split_once("=\"") else {
            break;
        };
        if name != "le" && name != "quantile" {
            names.push(name.to_owned());
        }
        // Skip the escaped value.
        let mut escaped = false;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[(end + 1).min(after.len())..];
    }
    names
}

/// Every sample name a query can use (`x_bucket`, `x_sum`, `x_total`, ...).
pub fn sample_names(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}
