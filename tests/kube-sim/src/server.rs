//! The HTTP front: routing of Kubernetes API paths, request shaping (Accept, patch types,
//! query parameters), faults and counters around every call, watch streams and admin routes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::Inner;
use crate::convert::{Shape, partial_metadata, shape_from_accept, table, to_external};
use crate::error::ApiError;
use crate::faults::FaultRule;
use crate::list::{self, ListOpts, ListResult};
use crate::ops::{self, DeleteOpts, Deleted, PatchType, Sub};
use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{EventType, WatchItem};

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/sim/counters", get(admin_counters))
        .route("/sim/counters/reset", post(admin_counters_reset))
        .route(
            "/sim/faults",
            get(admin_faults_list)
                .post(admin_faults_add)
                .delete(admin_faults_clear),
        )
        .route(
            "/sim/faults/{id}",
            axum::routing::delete(admin_faults_remove),
        )
        .route("/sim/drop-watches", post(admin_drop_watches))
        .route("/sim/compact", post(admin_compact))
        .route("/sim/pause", post(admin_pause))
        .route("/sim/resume", post(admin_resume))
        .route("/sim/dump", get(admin_dump))
        .route(
            "/sim/holds",
            get(admin_holds_list)
                .post(admin_holds_add)
                .delete(admin_holds_clear),
        )
        .route("/sim/holds/{id}/release", post(admin_holds_release))
        .route("/sim/writes", get(admin_writes))
        .fallback(api)
        .with_state(inner)
}

fn json_response(code: u16, v: &Value) -> Response {
    let mut r = (
        StatusCode::from_u16(code).unwrap_or(StatusCode::OK),
        v.to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

// ---- admin routes -------------------------------------------------------------------------

async fn admin_holds_list(State(i): State<Arc<Inner>>) -> Response {
    json_response(200, &json!(i.holds.list()))
}
async fn admin_holds_add(State(i): State<Arc<Inner>>, body: Bytes) -> Response {
    match serde_json::from_slice::<crate::holds::HoldRule>(&body) {
        Ok(rule) => json_response(201, &json!({"id": i.holds.add(rule)})),
        Err(e) => error_response(&ApiError::bad_request(format!("invalid hold rule: {e}"))),
    }
}
async fn admin_holds_clear(State(i): State<Arc<Inner>>) -> Response {
    i.holds.clear();
    json_response(200, &json!({}))
}
/// `?apply=false` drops a request held before it was applied; anything else lets it go on.
async fn admin_holds_release(
    State(i): State<Arc<Inner>>,
    Path(id): Path<u64>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
) -> Response {
    let apply = q.get("apply").is_none_or(|a| a != "false");
    json_response(200, &json!({"released": i.holds.release(id, apply)}))
}
async fn admin_writes(State(i): State<Arc<Inner>>) -> Response {
    json_response(200, &json!(i.holds.writes()))
}

async fn admin_counters(State(i): State<Arc<Inner>>) -> Response {
    json_response(200, &i.counters.snapshot().to_json())
}
async fn admin_counters_reset(State(i): State<Arc<Inner>>) -> Response {
    i.counters.reset();
    json_response(200, &json!({"reset": true}))
}
async fn admin_faults_list(State(i): State<Arc<Inner>>) -> Response {
    json_response(200, &json!({"faults": i.faults.list()}))
}
async fn admin_faults_add(State(i): State<Arc<Inner>>, body: Bytes) -> Response {
    match serde_json::from_slice::<FaultRule>(&body) {
        Ok(rule) => json_response(200, &json!({"id": i.faults.add(rule)})),
        Err(e) => json_response(
            400,
            &json!({"error": format!("invalid fault rule: {e}; see `kube-sim --help` for the fields")}),
        ),
    }
}
async fn admin_faults_clear(State(i): State<Arc<Inner>>) -> Response {
    i.faults.clear();
    json_response(200, &json!({"cleared": true}))
}
async fn admin_faults_remove(State(i): State<Arc<Inner>>, Path(id): Path<u64>) -> Response {
    json_response(200, &json!({"removed": i.faults.remove(id)}))
}
async fn admin_drop_watches(State(i): State<Arc<Inner>>) -> Response {
    let n = i.lock().drop_watches();
    json_response(200, &json!({"dropped": n}))
}
async fn admin_compact(State(i): State<Arc<Inner>>) -> Response {
    let mut st = i.lock();
    st.compact();
    json_response(
        200,
        &json!({"compactedAt": st.resource_version().to_string()}),
    )
}
async fn admin_pause(State(i): State<Arc<Inner>>) -> Response {
    i.paused.send_replace(true);
    json_response(200, &json!({"paused": true}))
}
async fn admin_resume(State(i): State<Arc<Inner>>) -> Response {
    i.paused.send_replace(false);
    json_response(200, &json!({"paused": false}))
}
async fn admin_dump(State(i): State<Arc<Inner>>) -> Response {
    json_response(200, &i.dump())
}

// ---- API routing ----------------------------------------------------------------------------

/// A parsed resource path.
#[derive(Debug, Clone)]
struct Route {
    rd: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    legacy_watch: bool,
}

enum Parsed {
    Resource(Route),
    Doc(Value),
    /// A path of a served group and version naming nothing there: a `Status` 404.
    NotFound,
    /// A path outside every served group and version (say a CRD's group that is not installed):
    /// kube-apiserver's mux answers Go's plain-text 404, not a `Status`.
    NoRoute,
}

fn parse_path(path: &str, server: &str) -> Parsed {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Parsed::Doc(crate::discovery::version()),
        ["api"] => return Parsed::Doc(crate::discovery::api_versions(server)),
        ["apis"] => return Parsed::Doc(crate::discovery::api_group_list()),
        ["apis", g] => return crate::discovery::api_group(g).map_or(Parsed::NoRoute, Parsed::Doc),
        ["api", v] | ["apis", _, v] if segs.len() <= 3 => {
            let g = if segs[0] == "api" { "" } else { segs[1] };
            return crate::discovery::resource_list(g, v).map_or(Parsed::NoRoute, Parsed::Doc);
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Parsed::NoRoute,
    };
    if !resources::RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return Parsed::NoRoute;
    }
    let (legacy_watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, r @ ..]
            if resources::find(group, version, plural).is_some_and(|d| d.namespaced) =>
        {
            (Some(ns.to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(r);
                v
            })
        }
        r => (None, r.to_vec()),
    };
    let Some(plural) = rest.first() else {
        return Parsed::NotFound;
    };
    let Some(rd) = resources::find(group, version, plural) else {
        return Parsed::NotFound;
    };
    if !rd.namespaced && ns.is_some() {
        return Parsed::NotFound;
    }
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return Parsed::NotFound;
    }
    if let Some(s) = &sub
        && !((s == "status" && rd.has_status)
            || (s == "finalize" && rd.plural == resources::NAMESPACES))
    {
        return Parsed::NotFound;
    }
    Parsed::Resource(Route {
        rd,
        ns,
        name,
        sub,
        legacy_watch,
    })
}

type Query = HashMap<String, String>;

fn flag(q: &Query, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

fn verb_of(method: &axum::http::Method, r: &Route, q: &Query) -> &'static str {
    use axum::http::Method;
    match (method.clone(), r.name.is_some()) {
        (Method::GET, false) if r.legacy_watch || flag(q, "watch") => "watch",
        (Method::GET, false) => "list",
        (Method::GET, true) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, false) => "deletecollection",
        (Method::DELETE, true) => "delete",
        _ => "unknown",
    }
}

fn render(rd: &ResourceDef, obj: &Value, shape: Shape) -> Value {
    match shape {
        Shape::Metadata => partial_metadata(obj),
        _ => to_external(rd, obj),
    }
}

async fn api(State(inner): State<Arc<Inner>>, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let q: Query = parts
        .uri
        .query()
        .map(|s| {
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
                .map(|x| x.0.into_iter().collect())
                .unwrap_or_else(|_| {
                    tracing::debug!(query = s, "unparsable query");
                    HashMap::new()
                })
        })
        .unwrap_or_default();
    if let Some(r) = openapi_response(&path, &parts.headers) {
        return r;
    }
    let route = match parse_path(&path, &inner.addr.to_string()) {
        Parsed::Doc(d) => return json_response(200, &d),
        Parsed::NotFound => return error_response(&ApiError::unknown_path()),
        Parsed::NoRoute => {
            if matches!(path.as_str(), "/healthz" | "/readyz" | "/livez") {
                return "ok".into_response();
            }
            let mut r = Response::new(Body::from("404 page not found\n"));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r.headers_mut().insert(
                "x-content-type-options",
                HeaderValue::from_static("nosniff"),
            );
            return r;
        }
        Parsed::Resource(r) => r,
    };
    let verb = verb_of(&parts.method, &route, &q);
    let resource = match &route.sub {
        Some(s) => format!("{}/{s}", route.rd.plural),
        None => route.rd.plural.to_string(),
    };
    let agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    inner.wait_unpaused().await;
    let name = route.name.clone().unwrap_or_default();
    let decision = inner.faults.decide(
        verb,
        &resource,
        route.rd.plural,
        &route.rd.qualified(),
        &name,
    );
    if !decision.latency.is_zero() {
        tokio::time::sleep(decision.latency).await;
    }
    if let Some(e) = decision.error {
        tracing::debug!(verb, resource, code = e.code, "injected fault");
        inner.counters.record(&agent, verb, &resource, e.code);
        return error_response(&e);
    }
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let shape = shape_from_accept(accept);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!("reading request body: {e}")));
        }
    };
    let hold = if verb == "watch" {
        None
    } else {
        inner.holds.arrive(verb, &resource, &name, &agent)
    };
    let mut held_after = None;
    if let Some(ticket) = hold {
        match ticket.when {
            crate::holds::When::Before => {
                if !ticket.released().await {
                    // The crash point "before the write reached the server": never applied.
                    return error_response(&ApiError::new(
                        503,
                        "ServiceUnavailable",
                        "request dropped by a hold",
                    ));
                }
            }
            crate::holds::When::After => held_after = Some(ticket),
        }
    }
    let result = if verb == "watch" {
        watch(&inner, &route, &q, shape)
    } else {
        serve(&inner, &route, verb, &q, shape, &content_type, &body)
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    let code = resp.status().as_u16();
    tracing::debug!(verb, resource, name, code, "request");
    inner.counters.record(&agent, verb, &resource, code);
    if code < 400 {
        inner.holds.log_write(&agent, verb, &resource, &name);
    }
    if let Some(ticket) = held_after {
        // The crash point "applied, not answered yet".
        ticket.released().await;
    }
    resp
}

fn openapi_response(path: &str, headers: &axum::http::HeaderMap) -> Option<Response> {
    let rest = path.strip_prefix("/openapi/")?;
    let doc = match rest.trim_end_matches('/') {
        "v3" => Some(crate::openapi::v3_index()),
        "v2" => {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if accept.contains("protobuf") {
                let mut r = Response::new(Body::from(crate::openapi::v2_protobuf()));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                    ),
                );
                return Some(r);
            }
            Some(crate::openapi::v2_json())
        }
        gv => gv
            .strip_prefix("v3/")
            .and_then(crate::openapi::v3_group_version),
    };
    Some(match doc {
        Some(d) => json_response(200, &d),
        None => error_response(&ApiError::unknown_path()),
    })
}

fn list_opts(rd: &ResourceDef, q: &Query) -> Result<ListOpts, ApiError> {
    Ok(ListOpts {
        labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), rd)?,
        limit: q.get("limit").and_then(|l| l.parse().ok()),
        continue_token: q.get("continue").cloned(),
        resource_version: q.get("resourceVersion").cloned(),
        version_match: q.get("resourceVersionMatch").cloned(),
    })
}

fn list_meta(res: &ListResult) -> Value {
    let mut m = json!({"resourceVersion": res.resource_version.to_string()});
    if let Some(c) = &res.continue_token {
        m["continue"] = json!(c);
    }
    if let Some(n) = res.remaining {
        m["remainingItemCount"] = json!(n);
    }
    m
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// A real API server decodes protobuf bodies; kube-sim does not, and says so plainly rather than
/// failing to parse them as JSON (recent client-go sends built-in types as protobuf by default).
fn protobuf_body(content_type: &str) -> ApiError {
    ApiError::unsupported_media(format!(
        "the body of the request has Content-Type {content_type:?}, which kube-sim does not decode: \
         it accepts JSON bodies only (application/json, and the JSON patch types {}); \
         configure the client to send JSON (client-go: rest.Config.ContentType = \"application/json\")",
        ops::PATCH_TYPES
    ))
}

fn serve(
    inner: &Inner,
    r: &Route,
    verb: &str,
    q: &Query,
    shape: Shape,
    content_type: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let rd = r.rd;
    let ns = r.ns.clone().unwrap_or_default();
    let name = r.name.clone().unwrap_or_default();
    let sub = if r.sub.as_deref() == Some("status") {
        Sub::Status
    } else {
        Sub::Main
    };
    let dry = q.get("dryRun").is_some_and(|d| !d.is_empty());
    let parse_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })
    };
    if rd.namespaced && r.ns.is_none() && !matches!(verb, "list" | "watch") {
        return Err(ApiError::method_not_allowed());
    }
    if !body.is_empty() && content_type.starts_with(PROTOBUF) {
        return Err(protobuf_body(content_type));
    }
    match verb {
        "get" => {
            let st = inner.lock();
            let obj = ops::get(&st, rd, &ns, &name)?;
            if shape == Shape::Table {
                return Ok(json_response(
                    200,
                    &table(
                        rd,
                        &[(*obj).clone()],
                        json!({"resourceVersion": st.resource_version().to_string()}),
                    ),
                ));
            }
            Ok(json_response(200, &render(rd, &obj, shape)))
        }
        "list" => {
            let o = list_opts(rd, q)?;
            list::validate_options(&o, false, false, inner.cfg.watch_list)?;
            let st = inner.lock();
            let res = list::list(&st, rd, r.ns.as_deref(), &o)?;
            drop(st);
            let meta = list_meta(&res);
            let doc = match shape {
                Shape::Table => {
                    let items: Vec<Value> = res.items.iter().map(|v| (**v).clone()).collect();
                    table(rd, &items, meta)
                }
                Shape::Metadata => {
                    json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                                          "items": res.items.iter().map(|v| partial_metadata(v)).collect::<Vec<_>>()})
                }
                Shape::Full => {
                    json!({"kind": format!("{}List", rd.kind), "apiVersion": rd.api_version(), "metadata": meta,
                                      "items": res.items.iter().map(|v| to_external(rd, v)).collect::<Vec<_>>()})
                }
            };
            Ok(json_response(200, &doc))
        }
        "create" if rd.plural == crate::resources::SSAR => {
            let review = crate::access::review(&inner.faults, parse_body()?)?;
            Ok(json_response(201, &review))
        }
        "create" if rd.plural == crate::resources::SSRR => {
            let review = crate::access::rules_review(&inner.faults, parse_body()?)?;
            Ok(json_response(201, &review))
        }
        "create" => {
            if r.name.is_some() {
                return Err(ApiError::method_not_allowed());
            }
            let b = parse_body()?;
            let obj = ops::create(&mut inner.lock(), &inner.policy, rd, &ns, b, dry)?;
            Ok(json_response(201, &render(rd, &obj, shape)))
        }
        "update" => {
            let b = parse_body()?;
            let obj = ops::update(&mut inner.lock(), rd, &ns, &name, b, sub, dry)?;
            Ok(json_response(200, &render(rd, &obj, shape)))
        }
        "patch" => {
            let Some(pt) = PatchType::from_content_type(content_type) else {
                // kube-apiserver's words for a patch of another content type (1.20).
                return Err(ApiError::unsupported_media("415: Unsupported Media Type"));
            };
            let obj = ops::patch(&mut inner.lock(), rd, &ns, &name, pt, body, sub, dry)?;
            Ok(json_response(200, &render(rd, &obj, shape)))
        }
        "delete" => {
            let mut opts = DeleteOpts::from_body(body)?;
            opts.dry |= dry;
            match ops::delete(&mut inner.lock(), rd, &ns, &name, &opts)? {
                Deleted::Pending(obj) => Ok(json_response(200, &render(rd, &obj, shape))),
                Deleted::Gone(obj) if returns_deleted_object(rd) => {
                    Ok(json_response(200, &render(rd, &obj, shape)))
                }
                Deleted::Gone(obj) => {
                    let mut details =
                        json!({"name": name, "kind": rd.plural, "uid": ops::meta_str(&obj, "uid")});
                    if !rd.group.is_empty() {
                        details["group"] = json!(rd.group);
                    }
                    Ok(json_response(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                    ))
                }
            }
        }
        "deletecollection" => {
            let o = list_opts(rd, q)?;
            let mut opts = DeleteOpts::from_body(body)?;
            opts.dry |= dry;
            opts.uid = None;
            opts.resource_version = None;
            let mut st = inner.lock();
            let res = list::list(
                &st,
                rd,
                r.ns.as_deref(),
                &ListOpts {
                    limit: None,
                    continue_token: None,
                    ..o
                },
            )?;
            let mut items = Vec::new();
            for v in res.items {
                let (ins, iname) = (
                    ops::meta_str(&v, "namespace").to_string(),
                    ops::meta_str(&v, "name").to_string(),
                );
                match ops::delete(&mut st, rd, &ins, &iname, &opts) {
                    Ok(Deleted::Gone(o)) | Ok(Deleted::Pending(o)) => {
                        items.push(render(rd, &o, shape))
                    }
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = st.resource_version();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", rd.kind), "apiVersion": rd.api_version(),
                                          "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// Whether kube-apiserver's registry of `rd` answers a delete with the deleted object
/// (`ReturnDeletedObject`) rather than a `Status`. Seen on 1.20: PVs, claims, Pods,
/// StorageClasses and CSINodes answer the object; Secrets, Leases, Nodes and Events a Status.
/// Namespaces and the other storage.k8s.io types are taken to be like their kin.
fn returns_deleted_object(rd: &ResourceDef) -> bool {
    matches!(
        (rd.group, rd.plural),
        (
            "",
            "persistentvolumes" | "persistentvolumeclaims" | "pods" | "namespaces"
        ) | ("storage.k8s.io", _)
    )
}

// ---- watch ----------------------------------------------------------------------------------

struct WatchStream {
    inner: Arc<Inner>,
    rd: &'static ResourceDef,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    shape: Shape,
    bookmarks: bool,
    rx: Option<tokio::sync::mpsc::UnboundedReceiver<WatchItem>>,
    first: Option<Bytes>,
    deadline: tokio::time::Instant,
}

impl WatchStream {
    fn visible(&self, obj: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|n| ops::meta_str(obj, "namespace") == n)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }

    fn line(&self, ty: &str, obj: &Value) -> Bytes {
        let o = match self.shape {
            Shape::Table => table(
                self.rd,
                std::slice::from_ref(obj),
                json!({"resourceVersion": ops::meta_str(obj, "resourceVersion")}),
            ),
            s => render(self.rd, obj, s),
        };
        let mut s = json!({"type": ty, "object": o}).to_string();
        s.push('\n');
        Bytes::from(s)
    }

    fn render(&self, item: WatchItem) -> Option<Bytes> {
        match item {
            WatchItem::Initial(obj) => self.visible(&obj).then(|| self.line("ADDED", &obj)),
            WatchItem::Event(rec) => {
                let now_in = self.visible(&rec.obj);
                let was_in = rec.prev.as_deref().is_some_and(|p| self.visible(p));
                let ty = match rec.kind {
                    EventType::Added => now_in.then_some("ADDED"),
                    EventType::Deleted => (was_in || now_in).then_some("DELETED"),
                    EventType::Modified => match (was_in, now_in) {
                        (true, true) => Some("MODIFIED"),
                        (false, true) => Some("ADDED"),
                        (true, false) => Some("DELETED"),
                        (false, false) => None,
                    },
                };
                ty.map(|t| self.line(t, &rec.obj))
            }
            WatchItem::Bookmark { rv, initial_end } => {
                if !self.bookmarks {
                    return None;
                }
                let (kind, api_version) = match self.shape {
                    Shape::Metadata => (
                        "PartialObjectMetadata".to_string(),
                        "meta.k8s.io/v1".to_string(),
                    ),
                    _ => (self.rd.kind.to_string(), self.rd.api_version()),
                };
                let mut meta = json!({"resourceVersion": rv.to_string()});
                if initial_end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                let mut s = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": meta}}).to_string();
                s.push('\n');
                Some(Bytes::from(s))
            }
        }
    }
}

fn watch(inner: &Arc<Inner>, r: &Route, q: &Query, shape: Shape) -> Result<Response, ApiError> {
    let rd = r.rd;
    let o = list_opts(rd, q)?;
    let bookmarks = flag(q, "allowWatchBookmarks");
    let send_initial = flag(q, "sendInitialEvents");
    list::validate_options(
        &o,
        true,
        q.contains_key("sendInitialEvents"),
        inner.cfg.watch_list,
    )?;
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(inner.cfg.max_watch_timeout, Duration::from_secs)
        .min(inner.cfg.max_watch_timeout);
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(_) if send_initial => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let started = inner
        .lock()
        .watch(rd.storage, from, bookmarks, send_initial);
    let mut ws = WatchStream {
        inner: inner.clone(),
        rd,
        ns: r.ns.clone(),
        labels: o.labels,
        fields: o.fields,
        shape,
        bookmarks: bookmarks || send_initial,
        rx: None,
        first: None,
        deadline: tokio::time::Instant::now() + timeout,
    };
    match started {
        Ok(rx) => ws.rx = Some(rx),
        Err(too_old) => {
            // The real server answers 200 and reports the expiry as the stream's only event.
            let status = ApiError::expired(format!(
                "too old resource version: {} ({})",
                too_old.requested, too_old.oldest
            ))
            .to_status();
            let mut s = json!({"type": "ERROR", "object": status}).to_string();
            s.push('\n');
            ws.first = Some(Bytes::from(s));
        }
    }
    let stream = futures::stream::unfold(ws, |mut ws| async move {
        if let Some(line) = ws.first.take() {
            return Some((Ok::<Bytes, std::convert::Infallible>(line), ws));
        }
        loop {
            let rx = ws.rx.as_mut()?;
            let item = tokio::select! {
                it = rx.recv() => it?,
                _ = tokio::time::sleep_until(ws.deadline) => return None,
            };
            ws.inner.wait_unpaused().await;
            if let Some(line) = ws.render(item) {
                return Some((Ok(line), ws));
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}
