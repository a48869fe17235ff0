//! One read of a sidecar's `/metrics` over plain HTTP, and a series' value from the text format.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The body of `GET /metrics`. HTTP/1.0, so neither server answers chunked.
pub async fn scrape(addr: SocketAddr) -> Result<String> {
    let read = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .context("/metrics did not answer within 5 s")??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("/metrics: no HTTP header")?;
    let ok = head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200");
    if !ok {
        bail!("/metrics answered {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

/// The value of series `name` whose labels include `label="value"` (any labels when `None`).
pub fn value(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}')?,
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            if let Some((k, v)) = label
                && !labels
                    .split(',')
                    .any(|l| l.trim() == format!("{k}=\"{v}\""))
            {
                return None;
            }
            value.split_whitespace().next()?.parse().ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_series_by_name_and_label() {
        let text = "# HELP workqueue_depth Current depth of workqueue\n\
                    # TYPE workqueue_depth gauge\n\
                    workqueue_depth{name=\"claims\"} 3\n\
                    workqueue_depth{name=\"csistoragecapacity\"} 4000\n\
                    workqueue_depth_other{name=\"csistoragecapacity\"} 1\n\
                    csi_provisioner_capacity_queue_oldest_seconds 12.5\n";
        let q = Some(("name", "csistoragecapacity"));
        assert_eq!(value(text, "workqueue_depth", q), Some(4000.0));
        assert_eq!(
            value(text, "workqueue_depth", Some(("name", "claims"))),
            Some(3.0)
        );
        assert_eq!(
            value(text, "csi_provisioner_capacity_queue_oldest_seconds", None),
            Some(12.5)
        );
        assert_eq!(value(text, "workqueue_adds_total", q), None);
    }
}
