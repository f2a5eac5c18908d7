//! The HTTP contract checked on every answer these tests get (S43): the OpenAPI
//! document the server serves names the answer's status for its route, its content
//! type, and a schema its JSON body validates against, strictly (an object field the
//! schema does not name fails it). `send` calls [`check`] on every response, so every
//! route test is also a test of the document.

use std::sync::OnceLock;

use serde_json::{json, Value};

/// The served document, parsed once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        serde_json::from_str(agentloop_http::openapi::document_json())
            .expect("the OpenAPI document is JSON")
    })
}

/// The document's components with every object schema closed: an object that names
/// its properties takes no others (utoipa leaves them open; the server's answers must
/// not carry a field the contract does not name).
fn strict_components() -> &'static Value {
    static STRICT: OnceLock<Value> = OnceLock::new();
    STRICT.get_or_init(|| {
        let mut c = document()["components"].clone();
        close_objects(&mut c);
        c
    })
}

fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), json!(false));
            }
            for (_, child) in map.iter_mut() {
                close_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// The path template of the document that `path` (no query) matches, if any.
pub fn template_of(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    document()["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .find(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            ts.len() == segments.len()
                && ts.iter().zip(&segments).all(|(t, s)| {
                    (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s
                })
        })
        .map(String::as_str)
}

/// Validates `body` against `schema` (which may `$ref` the document's components).
pub fn validate(schema: &Value, body: &Value, what: &str) {
    let validator = validator(schema, what);
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: the answer does not match the OpenAPI document:\n  {}\nbody: {body}",
        errors.join("\n  ")
    );
}

/// The validator of `schema` (with the document's closed components), compiled once
/// per schema: the route tests run in parallel on two cores, and compiling the whole
/// document for every answer would slow the servers they time.
fn validator(schema: &Value, what: &str) -> std::sync::Arc<jsonschema::Validator> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let key = schema.to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().expect("the validator cache").get(&key) {
        return v.clone();
    }
    let mut root = schema.clone();
    if let Value::Object(map) = &mut root {
        map.insert("components".into(), strict_components().clone());
    }
    close_objects(&mut root);
    let compiled = Arc::new(
        jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("{what}: the documented schema does not compile: {e}")),
    );
    cache
        .lock()
        .expect("the validator cache")
        .insert(key, compiled.clone());
    compiled
}

/// The `Error` schema, for answers no route documents (404 and 405 fallbacks).
fn error_schema() -> Value {
    json!({"$ref": "#/components/schemas/Error"})
}

/// Checks one answer against the document: `method` and `path` of the request, the
/// answer's status, content type and (for anything but an event stream) its body.
pub fn check(method: &str, path: &str, status: u16, content_type: Option<&str>, body: &[u8]) {
    let what = format!("{method} {path} → {status}");
    let json_body = || -> Value {
        serde_json::from_slice(body).unwrap_or_else(|e| {
            panic!(
                "{what}: the body is not JSON ({e}): {}",
                String::from_utf8_lossy(body)
            )
        })
    };
    let op = template_of(path)
        .and_then(|t| document()["paths"][t].get(method.to_ascii_lowercase()))
        .filter(|op| op.is_object());
    let Some(op) = op else {
        // No route, or not this method: the fallbacks (or a guard that ran first)
        // answer an error of the documented shape.
        assert!(
            status >= 400,
            "{what}: an undocumented route answered success"
        );
        validate(&error_schema(), &json_body(), &what);
        return;
    };
    let Some(response) = op["responses"].get(status.to_string()) else {
        panic!(
            "{what}: the status is not documented for this route (documented: {:?})",
            op["responses"]
                .as_object()
                .map(|m| m.keys().collect::<Vec<_>>())
        );
    };
    let Some(content) = response.get("content").and_then(Value::as_object) else {
        assert!(
            body.is_empty(),
            "{what}: the document says no body, the answer has {} bytes",
            body.len()
        );
        return;
    };
    let essence = content_type
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let media = content
        .iter()
        .find(|(k, _)| k.split(';').next().unwrap_or("").trim() == essence);
    let Some((_, media)) = media else {
        panic!(
            "{what}: content type {content_type:?} is not documented (documented: {:?})",
            content.keys().collect::<Vec<_>>()
        );
    };
    if essence == "application/json" {
        if let Some(schema) = media.get("schema") {
            validate(schema, &json_body(), &what);
        }
    }
}

/// Checks one Server-Sent Event against the `StreamEvent` schema.
pub fn check_event(name: &str, data: &Value) {
    validate(
        &json!({"$ref": "#/components/schemas/StreamEvent"}),
        &json!({"event": name, "data": data}),
        &format!("the `{name}` event"),
    );
}
