//! Writes the OpenAPI 3.1 document of the REST façade from proto/: each RPC's `(vak.v1.http)` option names its route, and the messages' descriptors give the JSON schemas (the proto3 JSON mapping with proto field names, as crates/vak-proto/src/json.rs writes it).
//!
//! Included by build.rs, so the document is rebuilt whenever the proto
//! changes and cannot drift from the service.

use prost_reflect::{
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    MethodDescriptor, Value as PValue,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// One `HttpRoute` option, read from the descriptor.
struct Route {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body: bool,
    ok: Vec<u32>,
    errors: Vec<u32>,
    sse: bool,
    media_type: String,
    headers: Vec<String>,
}

fn field<'a>(m: &'a DynamicMessage, name: &str) -> std::borrow::Cow<'a, PValue> {
    m.get_field_by_name(name)
        .unwrap_or_else(|| panic!("HttpRoute has no field {name}"))
}

fn string(v: &PValue) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn list(v: &PValue) -> Vec<PValue> {
    v.as_list().map(<[PValue]>::to_vec).unwrap_or_default()
}

fn route_of(method: &MethodDescriptor, ext: &ExtensionDescriptor) -> Option<Route> {
    let options = method.options();
    if !options.has_extension(ext) {
        return None;
    }
    let opt = options.get_extension(ext);
    let m = opt.as_message().expect("(vak.v1.http) is a message");
    let numbers = |name: &str| -> Vec<u32> {
        list(&field(m, name))
            .iter()
            .map(|v| v.as_u32().expect("a status is a uint32"))
            .collect()
    };
    Some(Route {
        method: string(&field(m, "method")).to_ascii_lowercase(),
        path: string(&field(m, "path")),
        query: list(&field(m, "query"))
            .iter()
            .map(|q| {
                let q = q.as_message().expect("QueryParam");
                let name = string(&field(q, "name"));
                let f = string(&field(q, "field"));
                (name.clone(), if f.is_empty() { name } else { f })
            })
            .collect(),
        body: field(m, "body").as_bool().unwrap_or(false),
        ok: numbers("ok"),
        errors: numbers("errors"),
        sse: field(m, "sse").as_bool().unwrap_or(false),
        media_type: string(&field(m, "media_type")),
        headers: list(&field(m, "headers")).iter().map(string).collect(),
    })
}

/// The leading comment of a method in the proto file, if kept.
fn comment(method: &MethodDescriptor) -> String {
    let file = method.parent_file();
    let path = method.path();
    file.file_descriptor_proto()
        .source_code_info
        .as_ref()
        .and_then(|info| info.location.iter().find(|l| l.path == path))
        .and_then(|l| l.leading_comments.as_deref())
        .map(|c| {
            c.lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

fn scalar(kind: &Kind, refs: &mut BTreeSet<String>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({"type": "number"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => json!({"type": "integer", "format": "int32"}),
        Kind::Uint32 | Kind::Fixed32 => json!({"type": "integer", "minimum": 0, "maximum": u32::MAX}),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"type": "integer", "format": "int64"}),
        Kind::Uint64 | Kind::Fixed64 => json!({"type": "integer", "minimum": 0}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
        Kind::Enum(e) => {
            json!({"type": "string", "enum": e.values().map(|v| crate::enum_json::json_name(&v)).collect::<Vec<_>>()})
        }
        Kind::Message(m) => match m.full_name() {
            // The well-known types' JSON forms.
            "google.protobuf.Struct" => json!({"type": "object"}),
            "google.protobuf.Value" => json!({}),
            "google.protobuf.ListValue" => json!({"type": "array"}),
            name => {
                refs.insert(name.to_string());
                json!({"$ref": format!("#/components/schemas/{name}")})
            }
        },
    }
}

fn field_schema(f: &FieldDescriptor, refs: &mut BTreeSet<String>) -> Value {
    if f.is_map() {
        let Kind::Message(entry) = f.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        json!({"type": "object", "additionalProperties": scalar(&entry.map_entry_value_field().kind(), refs)})
    } else if f.is_list() {
        json!({"type": "array", "items": scalar(&f.kind(), refs)})
    } else {
        scalar(&f.kind(), refs)
    }
}

/// `schema` or null: the proto3 JSON mapping reads null as a field's
/// default, so a body may carry it (answers never do: an unset field with
/// presence is left out).
fn nullable(schema: Value) -> Value {
    match schema.get("type") {
        Some(Value::String(t)) if schema.get("enum").is_none() => {
            let mut s = schema.clone();
            s["type"] = json!([t, "null"]);
            s
        }
        _ => json!({"anyOf": [schema, {"type": "null"}]}),
    }
}

/// A message's schema.
fn message_schema(m: &MessageDescriptor, refs: &mut BTreeSet<String>) -> Value {
    let mut props = Map::new();
    for f in m.fields() {
        props.insert(f.name().to_string(), nullable(field_schema(&f, refs)));
    }
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

fn path_fields(path: &str) -> Vec<String> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(str::to_string)
        .collect()
}

fn reason(status: u32) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad request: malformed JSON, an unknown field or query parameter, or an invalid value",
        401 => "No valid credentials",
        403 => "Forbidden: the Host header names neither a loopback nor a trusted host, or a cross-origin request (docs/protocol.md section 3)",
        404 => "Not found",
        409 => "Conflict with the current state",
        408 => "The work ran past its deadline and was stopped (a search)",
        413 => "Too large",
        429 => "A bound was hit (queue or stream caps)",
        502 => "The model service failed",
        503 => "Shutting down, or the session's storage failed (Retry-After)",
        _ => "See docs/protocol.md",
    }
}

fn operation(method: &MethodDescriptor, route: &Route, refs: &mut BTreeSet<String>) -> Value {
    let input = method.input();
    let mut params = Vec::new();
    let in_path = path_fields(&route.path);
    for name in &in_path {
        let f = input
            .get_field_by_name(name)
            .unwrap_or_else(|| panic!("{}: path field {name} is not in {}", method.name(), input.name()));
        params.push(json!({"name": name, "in": "path", "required": true,
            "schema": field_schema(&f, refs)}));
    }
    for (name, fname) in &route.query {
        let f = input.get_field_by_name(fname).unwrap_or_else(|| {
            panic!(
                "{}: query field {fname} is not in {}",
                method.name(),
                input.name()
            )
        });
        let mut p = json!({"name": name, "in": "query", "required": false,
            "schema": field_schema(&f, refs)});
        if f.is_list() {
            p["style"] = "form".into();
            p["explode"] = true.into();
        }
        params.push(p);
    }
    for h in &route.headers {
        params.push(json!({"name": h, "in": "header", "required": false, "schema": {"type": "string"}}));
    }
    let mut op = json!({
        "operationId": method.name(),
        "summary": comment(method),
        "tags": ["AgentService"],
        "parameters": params,
    });
    if route.body {
        op["requestBody"] = json!({"required": false, "content": {"application/json": {
            "schema": message_schema(&input, refs)}}});
    }
    let output = method.output();
    let ok_schema = scalar(&Kind::Message(output.clone()), refs);
    let mut responses = Map::new();
    let oks = if route.ok.is_empty() {
        vec![200]
    } else {
        route.ok.clone()
    };
    for s in oks {
        let content = if route.sse {
            // One event of the stream (how schemathesis and OpenAPI 3.2's
            // itemSchema read text/event-stream): `data` is one JSON object,
            // named by `event`; docs/protocol.md has each kind's fields.
            json!({"text/event-stream": {"schema": {"type": "object",
            "description": format!("One Server-Sent Event; `data` is the JSON of one frame of {} (the payload of the kind `event` names)", output.full_name()),
            "required": ["data"],
            "properties": {
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
                "id": {"type": "string"},
                "retry": {"type": "integer", "minimum": 0}
            }}}})
        } else if !route.media_type.is_empty() {
            json!({ route.media_type.clone(): {"schema": {"type": "string"}} })
        } else {
            json!({"application/json": {"schema": ok_schema.clone()}})
        };
        responses.insert(
            s.to_string(),
            json!({"description": reason(s), "content": content}),
        );
    }
    // Every route passes one guard first (docs/protocol.md section 3): a
    // foreign Host or Origin is 403 everywhere.
    let mut errors: BTreeSet<u32> = [400, 401, 403].into();
    errors.extend(route.errors.iter().copied());
    if route.body {
        errors.insert(413);
    }
    for s in errors {
        responses.insert(
            s.to_string(),
            json!({"description": reason(s), "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    op["responses"] = Value::Object(responses);
    op
}

/// The whole document.
pub fn document(pool: &DescriptorPool) -> Value {
    let ext = pool
        .get_extension_by_name("vak.v1.http")
        .expect("proto/vak/v1/http.proto defines (vak.v1.http)");
    let service = pool
        .get_service_by_name("vak.v1.AgentService")
        .expect("the AgentService");
    let mut refs = BTreeSet::new();
    let mut paths = Map::new();
    for method in service.methods() {
        let route = route_of(&method, &ext)
            .unwrap_or_else(|| panic!("rpc {} has no (vak.v1.http) route", method.name()));
        let op = operation(&method, &route, &mut refs);
        let entry = paths.entry(route.path.clone()).or_insert_with(|| json!({}));
        assert!(
            entry.get(&route.method).is_none(),
            "two RPCs on {} {}",
            route.method,
            route.path
        );
        entry[&route.method] = op;
    }
    extra_routes(&mut paths);
    // Every message a schema refers to, transitively.
    let mut schemas = Map::new();
    let mut todo: Vec<String> = refs.iter().cloned().collect();
    while let Some(name) = todo.pop() {
        if schemas.contains_key(&name) {
            continue;
        }
        let m = pool
            .get_message_by_name(&name)
            .unwrap_or_else(|| panic!("message {name}"));
        let mut more = BTreeSet::new();
        let s = message_schema(&m, &mut more);
        schemas.insert(name, s);
        todo.extend(more.into_iter().filter(|n| !schemas.contains_key(n)));
    }
    schemas.insert(
        "Error".into(),
        json!({"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "kind": {"type": "string"},
            "reason": {"type": "string"},
            "incident": {"type": "string"}
        }}}}),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "vak REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The REST/SSE façade of vak's AgentService (proto/vak/v1/agent.proto). Generated at build time from the proto; the contract in prose is docs/protocol.md."
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

/// The routes that are not RPCs: liveness, the login of a browser, and
/// this document; none needs credentials.
fn extra_routes(paths: &mut Map<String, Value>) {
    let error = |d: &str| {
        json!({"description": d, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}})
    };
    let authenticated = json!({"type": "object", "required": ["authenticated"],
        "properties": {"authenticated": {"type": "boolean"}}});
    paths.insert("/health".into(), json!({"get": {
        "operationId": "Health", "summary": "Liveness: ok, or degraded with the sessions a storage failure stopped.",
        "tags": ["Server"], "security": [],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {
            "type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "enum": ["ok", "degraded"]},
                "storage_failures": {"type": "array", "items": {"type": "object", "properties": {
                    "session_id": {"type": "string"}, "reason": {"type": "string"}}}}}}}}},
            "400": error(reason(400)), "403": error(reason(403))}}}));
    paths.insert("/openapi.json".into(), json!({"get": {
        "operationId": "OpenApi", "summary": "This document.", "tags": ["Server"], "security": [],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            "400": error(reason(400)), "403": error(reason(403))}}}));
    paths.insert("/auth/login".into(), json!({"post": {
        "operationId": "Login", "summary": "Exchanges the token, or a one-time login link's ticket, for a login cookie and the session key a page sends with each request.",
        "tags": ["Auth"], "security": [],
        "requestBody": {"required": true, "content": {"application/json": {"schema": {
            "type": "object", "properties": {"token": {"type": "string"}, "ticket": {"type": "string",
                "description": "From POST /auth/ticket: works once, within 60 s."}}}}}},
        "responses": {"200": {"description": "Logged in", "content": {"application/json": {"schema": {
            "type": "object", "required": ["authenticated", "key"], "properties": {
                "authenticated": {"type": "boolean"}, "key": {"type": "string"}}}}}},
            "400": error(reason(400)), "403": error(reason(403)), "401": error("The token is not valid, or the ticket is used, expired or unknown"), "413": error(reason(413))}}}));
    paths.insert("/auth/ticket".into(), json!({"post": {
        "operationId": "LoginTicket", "summary": "A one-time login link for /app: its ticket logs one browser in once (POST /auth/login {ticket}), within 60 s. Only with the bearer token, never a login.",
        "tags": ["Auth"], "security": [{"bearer": []}],
        "responses": {"200": {"description": "A ticket and the link's path", "content": {"application/json": {"schema": {
            "type": "object", "required": ["ticket", "path", "expires_in_s"], "properties": {
                "ticket": {"type": "string"}, "path": {"type": "string"}, "expires_in_s": {"type": "integer"}}}}}},
            "400": error(reason(400)), "401": error(reason(401)), "403": error(reason(403)),
            "429": error("16 login links wait to be used already")}}}));
    // Not an RPC: a WebSocket (a terminal is one bidirectional byte
    // stream; gRPC-web carries no client streams). docs/protocol.md has the frames.
    paths.insert("/pty".into(), json!({"get": {
        "operationId": "Terminal", "tags": ["Server"],
        "summary": "A WebSocket onto a shell on a pty in an open, trusted workspace: binary frames are bytes (input in, output out), text frames JSON control messages ({\"type\":\"resize\",\"cols\",\"rows\"} in; {\"type\":\"started\",\"pid\",\"shell\",\"workspace\"} and {\"type\":\"exit\",\"code\"} out). Off unless [server.web] terminal = true; from this machine only unless terminal_requires_loopback = false; the socket lives as long as the shell.",
        "parameters": [
            {"name": "workspace", "in": "query", "required": false, "schema": {"type": "string"},
             "description": "An open, trusted workspace (absolute path); absent: the server's own."},
            {"name": "cols", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
            {"name": "rows", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
        "responses": {"101": {"description": "Switching to the WebSocket protocol"},
            "400": error("Not a WebSocket handshake, a bad size or an unknown parameter"),
            "401": error(reason(401)),
            "403": error("The terminal is off (reason terminal_off), the peer is not on this machine (terminal_loopback_only), the workspace is untrusted (untrusted_workspace), or the Origin is another site's"),
            "404": error("No open workspace there (workspace_not_open)"),
            "429": error("8 terminals are open already (too_many_terminals)")}}}));
    // Not an RPC: the Prometheus text exposition, for a scraper (docs/protocol.md
    // lists every metric). `vak serve --metrics-listen` also serves it token-free on loopback.
    paths.insert("/metrics".into(), json!({"get": {
        "operationId": "Metrics", "tags": ["Server"],
        "summary": "Every metric in the Prometheus text exposition format 0.0.4 (vak_* counters, gauges and histograms with bounded labels). Also served without a token on `vak serve --metrics-listen <loopback ADDR>`.",
        "responses": {"200": {"description": "The exposition", "content": {"text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}}}},
            "400": error(reason(400)), "401": error(reason(401)), "403": error(reason(403))}}}));
    paths.insert("/auth/logout".into(), json!({"post": {
        "operationId": "Logout", "summary": "Forgets the login cookie.", "tags": ["Auth"], "security": [],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": authenticated}}},
            "400": error(reason(400)), "403": error(reason(403))}}}));
    paths.insert("/auth/session".into(), json!({"get": {
        "operationId": "LoginState", "summary": "Whether the request's credentials are valid.", "tags": ["Auth"], "security": [],
        "parameters": [{"name": "key", "in": "query", "required": false, "schema": {"type": "string"}}],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": authenticated}}},
            "400": error(reason(400)), "403": error(reason(403))}}}));
}
