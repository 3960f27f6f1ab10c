//! The OpenAPI document: served without a token, covering every RPC and every REST route, each documented operation routed, and docs/openapi.json the document the build generates (schemathesis checks the responses: make test-api).

use crate::support::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

fn document() -> Value {
    serde_json::from_str(vak::proto::OPENAPI_JSON).expect("the document is JSON")
}

/// `(method, path)` of every documented operation.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.push((method.clone(), path.clone()));
        }
    }
    ops
}

/// A route pattern with its parameter names erased: `/sessions/{}/run`.
fn shape(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "{}" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn the_document_is_served_without_a_token() {
    let s = TestServer::start().await;
    let resp = reqwest::get(format!("{}/openapi.json", s.url)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let served: Value = resp.json().await.unwrap();
    assert_eq!(served, document());
    assert_eq!(served["openapi"], "3.1.0");
    // A route that needs the token still does.
    let resp = reqwest::get(format!("{}/sessions", s.url)).await.unwrap();
    assert_eq!(resp.status(), 401);
    s.stop().await;
}

#[test]
fn every_rpc_is_an_operation() {
    let pool = prost_reflect::DescriptorPool::decode(vak::proto::FILE_DESCRIPTOR_SET).unwrap();
    let service = pool.get_service_by_name("vak.v1.AgentService").unwrap();
    let doc = document();
    let ids: BTreeSet<String> = operations(&doc)
        .iter()
        .map(|(m, p)| doc["paths"][p][m]["operationId"].as_str().unwrap().to_string())
        .collect();
    for method in service.methods() {
        assert!(
            ids.contains(method.name()),
            "rpc {} has no operation",
            method.name()
        );
    }
}

/// Every literal `.route("...")` of the REST façade is in the document, so
/// a route added without its RPC option fails here.
#[test]
fn every_rest_route_is_documented() {
    let doc = document();
    let documented: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(|p| shape(p))
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = 0;
    for file in [
        "crates/vak-server/src/http/routes.rs",
        "crates/vak-server/src/server.rs",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find(".route(") {
            rest = &rest[i + ".route(".len()..];
            let trimmed = rest.trim_start();
            let Some(lit) = trimmed.strip_prefix('"') else {
                continue; // a computed path: the gRPC services
            };
            let path = &lit[..lit.find('"').unwrap()];
            found += 1;
            assert!(
                documented.contains(&shape(path)),
                "{file} routes {path}, which the OpenAPI document does not have: give its RPC an (vak.v1.http) option"
            );
        }
    }
    assert!(found > 30, "the route scan found only {found} routes");
}

/// Every documented operation reaches a handler: never the router's
/// "no such route" 404 nor a 405.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let s = TestServer::start().await;
    let http = s.http();
    let doc = document();
    for (method, path) in operations(&doc) {
        let url = format!(
            "{}{}",
            s.url,
            path.replace(['{', '}'], "").replace("session_id", "nosuch")
        );
        let m = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
        let resp = http.request(m, &url).send().await.unwrap();
        let status = resp.status().as_u16();
        let documented = doc["paths"][&path][&method]["responses"]
            .as_object()
            .unwrap()
            .contains_key(&status.to_string());
        // An SSE route answers with its headers and streams on: read no further.
        let body = if resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "text/event-stream")
        {
            String::new()
        } else {
            resp.text().await.unwrap()
        };
        assert_ne!(status, 405, "{method} {path}: {body}");
        assert!(!body.contains("no such route"), "{method} {path}: {body}");
        assert!(
            documented,
            "{method} {path} answered {status}, which it does not document: {body}"
        );
    }
    s.stop().await;
}

/// docs/openapi.json is the generated document (`make openapi` rewrites it).
#[test]
fn the_committed_document_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    if std::env::var_os("VAK_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, vak::proto::OPENAPI_JSON).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == vak::proto::OPENAPI_JSON,
        "docs/openapi.json is not the document the build generates from proto/: run `make openapi`"
    );
}

mod statuses;

/// The RPCs that only read carry `idempotency_level = NO_SIDE_EFFECTS`
/// (what Connect's GET calls and retrying clients go by), and those are
/// exactly the unary List*, Get*, Search and ReadFile, each a GET route.
#[test]
fn read_only_rpcs_are_marked_side_effect_free_and_are_gets() {
    let pool = prost_reflect::DescriptorPool::decode(vak::proto::FILE_DESCRIPTOR_SET).unwrap();
    let service = pool.get_service_by_name("vak.v1.AgentService").unwrap();
    let doc = document();
    let verb_of: std::collections::BTreeMap<String, String> = operations(&doc)
        .iter()
        .map(|(m, p)| {
            (
                doc["paths"][p][m]["operationId"].as_str().unwrap().to_string(),
                m.to_string(),
            )
        })
        .collect();
    let mut marked = 0;
    for method in service.methods() {
        let name = method.name();
        let reads = !method.is_server_streaming()
            && (name.starts_with("List")
                || name.starts_with("Get")
                || name == "Search"
                || name == "ReadFile"
                || name == "ExplainIntent");
        let level = method
            .options()
            .get_field_by_name("idempotency_level")
            .and_then(|v| v.as_enum_number())
            .unwrap_or(0);
        // google.protobuf.MethodOptions.IdempotencyLevel: NO_SIDE_EFFECTS = 1.
        assert_eq!(level == 1, reads, "rpc {name}: idempotency_level {level}");
        if reads {
            marked += 1;
            assert_eq!(
                verb_of.get(name).map(String::as_str),
                Some("get"),
                "rpc {name} reads: a GET route"
            );
        }
    }
    assert!(marked >= 28, "{marked}");
}
