//! `Status` error bodies shaped exactly like kube-apiserver's (reason, code, message, details).

use serde_json::{Value, json};

use crate::resources::ResourceDef;

/// A failed API call, rendered as a `meta/v1 Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
    pub retry_after: Option<u64>,
}

/// One `details.causes` entry of a 422 Invalid.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub kind: CauseKind,
    pub field: String,
    /// Text after the type prefix, e.g. `"Foo": a lowercase RFC 1123 ...` for Invalid.
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CauseKind {
    Required,
    Invalid,
    Forbidden,
    NotSupported,
    Duplicate,
}

impl Cause {
    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(CauseKind::Required, field, detail)
    }
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self::new(
            CauseKind::Invalid,
            field,
            &format!("{}: {detail}", go_value(value)),
        )
    }
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(CauseKind::Forbidden, field, detail)
    }
    pub fn not_supported(field: &str, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self::new(
            CauseKind::NotSupported,
            field,
            &format!("{}: supported values: {}", go_value(value), list.join(", ")),
        )
    }
    pub fn new(kind: CauseKind, field: &str, detail: &str) -> Self {
        Self {
            kind,
            field: field.to_string(),
            detail: detail.to_string(),
        }
    }

    fn type_text(&self) -> &'static str {
        match self.kind {
            CauseKind::Required => "Required value",
            CauseKind::Invalid => "Invalid value",
            CauseKind::Forbidden => "Forbidden",
            CauseKind::NotSupported => "Unsupported value",
            CauseKind::Duplicate => "Duplicate value",
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            CauseKind::Required => "FieldValueRequired",
            CauseKind::Invalid => "FieldValueInvalid",
            CauseKind::Forbidden => "FieldValueForbidden",
            CauseKind::NotSupported => "FieldValueNotSupported",
            CauseKind::Duplicate => "FieldValueDuplicate",
        }
    }

    /// `Required value` or `Invalid value: "x": why`.
    pub fn body(&self) -> String {
        if self.detail.is_empty() {
            self.type_text().to_string()
        } else {
            format!("{}: {}", self.type_text(), self.detail)
        }
    }

    /// `spec.capacity: Required value`.
    pub fn full(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// Renders a value the way Go's `%#v`-ish field errors print it (strings quoted).
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

/// The group of the type the server stores `rd` as.
fn stored_group(rd: &ResourceDef) -> &'static str {
    crate::resources::by_storage(rd.storage).map_or(rd.group, |s| s.group)
}

/// The causes as the message lists them: one alone, several in brackets.
fn summary(causes: &[Cause]) -> String {
    if causes.len() == 1 {
        causes[0].full()
    } else {
        let all: Vec<String> = causes.iter().map(Cause::full).collect();
        format!("[{}]", all.join(", "))
    }
}

fn cause_values(causes: &[Cause]) -> Vec<Value> {
    causes
        .iter()
        .map(|c| json!({"reason": c.reason(), "message": c.body(), "field": c.field}))
        .collect()
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: json!({}),
            retry_after: None,
        }
    }

    fn with_details(mut self, rd: &ResourceDef, name: &str) -> Self {
        let mut d = serde_json::Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !rd.group.is_empty() {
            d.insert("group".into(), json!(rd.group));
        }
        d.insert("kind".into(), json!(rd.plural));
        self.details = Value::Object(d);
        self
    }

    pub fn not_found(rd: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", rd.qualified()),
        )
        .with_details(rd, name)
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::not_found(crate::resources::core(crate::resources::NAMESPACES), ns)
    }

    pub fn already_exists(rd: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", rd.qualified()),
        )
        .with_details(rd, name)
    }

    pub fn conflict(rd: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                rd.qualified()
            ),
        )
        .with_details(rd, name)
    }

    pub fn modified(rd: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            rd,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(rd: &ResourceDef, name: &str, causes: &[Cause]) -> Self {
        // The kind is qualified by its group (`StorageClass.storage.k8s.io`), that of the stored
        // type: events.k8s.io Events are core Events to the server.
        let group = stored_group(rd);
        let qualified = match group {
            "" => rd.kind.to_string(),
            g => format!("{}.{g}", rd.kind),
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {}", summary(causes)),
        );
        let causes = cause_values(causes);
        let mut d = serde_json::Map::new();
        d.insert("name".into(), json!(name));
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(rd.kind));
        d.insert("causes".into(), Value::Array(causes));
        e.details = Value::Object(d);
        e
    }

    /// 422 for invalid request options (`ListOptions.meta.k8s.io "" is invalid: ...`): the
    /// object has no name and the kind is the options type of group meta.k8s.io.
    pub fn invalid_options(kind: &str, causes: &[Cause]) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind}.meta.k8s.io \"\" is invalid: {}", summary(causes)),
        );
        e.details = json!({"group": "meta.k8s.io", "kind": kind, "causes": cause_values(causes)});
        e
    }

    /// A delete precondition that does not hold, as kube-apiserver's `BeforeDelete` words it:
    /// the object named by its kind (not its resource), `what` "UID" or "ResourceVersion".
    pub fn delete_precondition(
        rd: &ResourceDef,
        name: &str,
        what: &str,
        want: &str,
        have: &str,
    ) -> Self {
        let group = stored_group(rd);
        let qualified = match group {
            "" => rd.kind.to_string(),
            g => format!("{}.{g}", rd.kind),
        };
        let consequence = match what {
            "UID" => "deleted and then recreated",
            _ => "modified",
        };
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} {name:?}: the {what} in the precondition ({want}) does not match the {what} in record ({have}). The object might have been {consequence}"
            ),
        );
        let mut d = serde_json::Map::new();
        d.insert("name".into(), json!(name));
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(rd.kind));
        e.details = Value::Object(d);
        e
    }

    /// A plain Go error the server did not classify: 500 with no reason, its text as message
    /// (for example etcd's "resourceVersion should not be set on objects to be created").
    pub fn unclassified(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unknown_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: &str) -> Self {
        let mut e = Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        e.details = json!({"causes": [{"message": message}]});
        e
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // An unclassified error has no reason; the real server then omits the field.
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if self.details.as_object().is_some_and(|d| !d.is_empty()) {
            s["details"] = self.details.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
