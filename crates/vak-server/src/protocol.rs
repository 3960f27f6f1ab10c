//! Which of the four protocols on the one port a request speaks (REST/SSE, gRPC, gRPC-web, Connect), told from its method, path, content type and query alone, so the guard, the dispatch, the stream counters and the access log agree.

use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};

/// The protocol of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// The REST façade, SSE, the pages and anything else.
    Rest,
    /// gRPC or gRPC-web; the request's content type labels its refusals.
    Grpc { web: bool, content_type: HeaderValue },
    /// The Connect protocol (connectrpc.com/docs/protocol).
    Connect(ConnectCall),
}

/// How a Connect request is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnectCall {
    /// `application/connect+*`: enveloped messages, an end-of-stream message.
    pub(crate) streaming: bool,
    /// A unary call made with GET (the message in the query).
    pub(crate) get: bool,
    /// The message encoding; None: a content type Connect has but vak does not speak.
    pub(crate) codec: Option<Codec>,
}

/// A Connect message encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    /// Canonical proto3 JSON.
    Json,
    /// Binary protobuf.
    Proto,
}

impl Codec {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Codec::Json => "json",
            Codec::Proto => "proto",
        }
    }
}

impl Protocol {
    pub(crate) fn of(method: &Method, uri: &Uri, headers: &HeaderMap) -> Protocol {
        let content_type = headers.get(header::CONTENT_TYPE);
        if let Some(v) = content_type.filter(|v| v.as_bytes().starts_with(b"application/grpc")) {
            return Protocol::Grpc {
                web: v.as_bytes().starts_with(b"application/grpc-web"),
                content_type: v.clone(),
            };
        }
        // Most requests end here, with nothing allocated.
        if !is_rpc_path(uri.path()) {
            return Protocol::Rest;
        }
        let ct = content_type
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
        let ct = ct.as_deref().unwrap_or("");
        if *method == Method::GET {
            // A Connect GET always names its encoding; any other GET of an RPC path is no call.
            let encoding = query_value(uri, "encoding");
            return match encoding {
                Some(e) => Protocol::Connect(ConnectCall {
                    streaming: false,
                    get: true,
                    codec: codec_named(&e),
                }),
                None => Protocol::Rest,
            };
        }
        if *method != Method::POST {
            return Protocol::Rest;
        }
        if let Some(name) = ct.strip_prefix("application/connect+") {
            return Protocol::Connect(ConnectCall {
                streaming: true,
                get: false,
                codec: codec_named(name),
            });
        }
        // A POST to an RPC path is a Connect unary call: `application/json`
        // and `application/proto`, or another codec answered 415.
        Protocol::Connect(ConnectCall {
            streaming: false,
            get: false,
            codec: ct.strip_prefix("application/").and_then(codec_named),
        })
    }

    /// The name the access log and the docs give it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Protocol::Rest => "rest",
            Protocol::Grpc { web: false, .. } => "grpc",
            Protocol::Grpc { web: true, .. } => "grpc_web",
            Protocol::Connect(_) => "connect",
        }
    }
}

/// A gRPC or gRPC-web request, told by its content type alone (the cheap
/// check the accept loop makes on every request).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

fn codec_named(name: &str) -> Option<Codec> {
    match name {
        "json" => Some(Codec::Json),
        "proto" => Some(Codec::Proto),
        _ => None,
    }
}

/// `/<package.Service>/<Method>`: two segments, the first a qualified name.
/// No REST route has that shape (`no_rest_route_looks_like_an_rpc` checks the OpenAPI document).
pub(crate) fn is_rpc_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let Some((service, method)) = rest.split_once('/') else {
        return false;
    };
    service.contains('.')
        && !service.starts_with('.')
        && !method.is_empty()
        && !method.contains('/')
        && service
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
        && method.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// One query parameter, percent-decoded.
pub(crate) fn query_value(uri: &Uri, name: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(uri.query()?).ok()?;
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str, ct: Option<&str>) -> Protocol {
        let mut h = HeaderMap::new();
        if let Some(ct) = ct {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        }
        Protocol::of(&method, &uri.parse().unwrap(), &h)
    }

    #[test]
    fn each_protocol_is_told_apart() {
        let rpc = "/vak.v1.AgentService/GetSession";
        assert_eq!(of(Method::POST, rpc, Some("application/grpc")).name(), "grpc");
        assert_eq!(
            of(Method::POST, rpc, Some("application/grpc-web+proto")).name(),
            "grpc_web"
        );
        assert_eq!(
            of(Method::POST, rpc, Some("application/json; charset=utf-8")),
            Protocol::Connect(ConnectCall {
                streaming: false,
                get: false,
                codec: Some(Codec::Json)
            })
        );
        assert_eq!(
            of(Method::POST, rpc, Some("application/connect+proto")),
            Protocol::Connect(ConnectCall {
                streaming: true,
                get: false,
                codec: Some(Codec::Proto)
            })
        );
        assert_eq!(
            of(Method::POST, rpc, Some("application/xml")),
            Protocol::Connect(ConnectCall {
                streaming: false,
                get: false,
                codec: None
            })
        );
        assert_eq!(
            of(
                Method::GET,
                &format!("{rpc}?connect=v1&encoding=json&message=%7B%7D"),
                None
            ),
            Protocol::Connect(ConnectCall {
                streaming: false,
                get: true,
                codec: Some(Codec::Json)
            })
        );
        // REST keeps its own: JSON bodies on REST paths, GETs without an encoding.
        assert_eq!(
            of(Method::POST, "/sessions", Some("application/json")),
            Protocol::Rest
        );
        assert_eq!(
            of(Method::POST, "/sessions/abc/run", Some("application/json")),
            Protocol::Rest
        );
        assert_eq!(of(Method::GET, rpc, None), Protocol::Rest);
        assert_eq!(of(Method::GET, "/openapi.json", None), Protocol::Rest);
    }

    #[test]
    fn no_rest_route_looks_like_an_rpc() {
        let doc: serde_json::Value = serde_json::from_str(vak_proto::OPENAPI_JSON).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.len() > 50);
        for path in paths.keys() {
            assert!(!is_rpc_path(path), "{path} would be taken for a Connect call");
        }
        assert!(is_rpc_path("/grpc.health.v1.Health/Check"));
    }
}
