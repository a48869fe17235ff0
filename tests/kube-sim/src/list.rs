//! list: selectors, key order, `limit`/`continue` pagination and resourceVersion semantics.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::{ApiError, Cause};
use crate::ops::meta_str;
use crate::resources::ResourceDef;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::Store;
use crate::util::{b64_decode, b64_encode};

#[derive(Debug, Clone, Default)]
pub struct ListOpts {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub version_match: Option<String>,
}

#[derive(Debug)]
pub struct ListResult {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    b64_encode(v.to_string().as_bytes())
}

fn decode_continue(tok: &str) -> Result<(u64, String, String), ApiError> {
    let bad = |why: &str| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid: {why}"
        ))
    };
    let raw = b64_decode(tok).ok_or_else(|| bad("illegal base64 data"))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| bad(&e.to_string()))?;
    if v.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let rv = v
        .get("rv")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion"))?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no start key"))?;
    let start = start.trim_end_matches('\u{0}');
    let (ns, name) = start
        .split_once('/')
        .ok_or_else(|| bad("start key is malformed"))?;
    Ok((rv, ns.to_string(), name.to_string()))
}

/// The real server's `ValidateListOptions` (1.33): `resourceVersionMatch` needs a
/// `resourceVersion` and no `continue` on a list, and on a watch it is allowed only with
/// `sendInitialEvents` (a streaming list); an invalid combination is 422, not ignored.
/// `send_initial` is whether the parameter was given at all (Go reads it as a pointer).
pub fn validate_options(
    o: &ListOpts,
    watch: bool,
    send_initial: bool,
    watch_list_gate: bool,
) -> Result<(), ApiError> {
    let field = "resourceVersionMatch";
    let matching = o.version_match.as_deref().unwrap_or("");
    let rv = o.resource_version.as_deref().unwrap_or("");
    let continues = o.continue_token.as_deref().is_some_and(|c| !c.is_empty());
    let mut causes = Vec::new();
    if watch {
        if send_initial {
            if matching != "NotOlderThan" {
                causes.push(Cause::forbidden(
                    field,
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !watch_list_gate {
                causes.push(Cause::forbidden(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                ));
            }
        }
        if !matching.is_empty() {
            if !send_initial {
                causes.push(Cause::forbidden(
                    field,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if matching != "NotOlderThan" {
                causes.push(Cause::not_supported(
                    field,
                    &json!(matching),
                    &["NotOlderThan"],
                ));
            }
            if continues {
                causes.push(Cause::forbidden(
                    field,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
    } else if !matching.is_empty() {
        if rv.is_empty() {
            causes.push(Cause::forbidden(
                field,
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if continues {
            causes.push(Cause::forbidden(
                field,
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if matching != "Exact" && matching != "NotOlderThan" {
            causes.push(Cause::not_supported(
                field,
                &json!(matching),
                &["Exact", "NotOlderThan", ""],
            ));
        }
        if matching == "Exact" && rv == "0" {
            causes.push(Cause::forbidden(
                field,
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    match causes.is_empty() {
        true => Ok(()),
        false => Err(ApiError::invalid_options("ListOptions", &causes)),
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
}

/// Lists objects in key order, paginated with `limit`/`continue`. Later pages are served from
/// a snapshot at the first page's resourceVersion (as etcd does), rebuilt from watch history;
/// when that history is gone the continue token has expired (410).
pub fn list(
    st: &Store,
    rd: &ResourceDef,
    ns: Option<&str>,
    o: &ListOpts,
) -> Result<ListResult, ApiError> {
    use std::ops::Bound;
    let current = st.resource_version();
    let (list_rv, candidates): (u64, Vec<Arc<Value>>) = if let Some(tok) =
        o.continue_token.as_deref().filter(|t| !t.is_empty())
    {
        let (rv, cns, cname) = decode_continue(tok)?;
        let snap = st
            .snapshot(rd.storage, rv)
            .ok_or_else(|| ApiError::expired(CONTINUE_TOO_OLD))?;
        let after = snap
            .range((Bound::Excluded((cns, cname)), Bound::Unbounded))
            .map(|(_, v)| v.clone())
            .collect();
        (rv, after)
    } else if let (Some("Exact"), Some(rv)) =
        (o.version_match.as_deref(), o.resource_version.as_deref())
    {
        let rv = parse_rv(rv)?;
        let snap = st.snapshot(rd.storage, rv).ok_or_else(|| {
            ApiError::expired(format!("too old resource version: {rv} ({current})"))
        })?;
        (rv, snap.into_values().collect())
    } else {
        if let Some(rv) = o.resource_version.as_deref().filter(|r| !r.is_empty())
            && parse_rv(rv)? > current
        {
            // kube-apiserver's watch cache waits 3 s for a resourceVersion it has not
            // reached, then answers this (kube-sim answers at once).
            let mut e = ApiError::new(
                504,
                "Timeout",
                format!("Timeout: Too large resource version: {rv}, current: {current}"),
            );
            e.details = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1});
            e.retry_after = Some(1);
            return Err(e);
        }
        (current, st.list(rd.storage, None))
    };
    let mut items = Vec::new();
    let mut continue_token = None;
    let mut remaining = None;
    let mut iter = candidates
        .into_iter()
        .filter(|v| ns.is_none_or(|n| meta_str(v, "namespace") == n))
        .filter(|v| o.labels.matches(v) && o.fields.matches(v))
        .peekable();
    while let Some(v) = iter.next() {
        items.push(v);
        if let Some(limit) = o.limit.filter(|l| *l > 0)
            && items.len() >= limit
            && iter.peek().is_some()
        {
            let last = items
                .last()
                .map(|l| {
                    (
                        meta_str(l, "namespace").to_string(),
                        meta_str(l, "name").to_string(),
                    )
                })
                .unwrap_or_default();
            continue_token = Some(encode_continue(list_rv, &last.0, &last.1));
            if o.labels.is_empty() && o.fields.is_empty() {
                remaining = Some(iter.count() as u64);
            }
            break;
        }
    }
    Ok(ListResult {
        items,
        resource_version: list_rv,
        continue_token,
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_token_round_trip() {
        let t = encode_continue(42, "ns", "a.b");
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, "ns".into(), "a.b".into())
        );
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }
}
