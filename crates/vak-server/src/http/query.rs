//! Query parameters each REST route accepts: anything else is a 400 naming it, as unknown JSON fields already are, so a misspelled `?sessions=` never silently opens an empty stream.

use crate::errors::json_error;
use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

/// Accepted on every route: the credentials EventSource can carry, `token` (loopback
/// only) and a login's session `key` (see the auth guard).
const ALWAYS: &[&str] = &["token", "key"];

/// The parameters a route reads, by its route pattern.
fn params(route: &str) -> &'static [&'static str] {
    match route {
        "/sessions/{id}/events" => &["after"],
        "/stream" => super::stream::PARAMS,
        "/fs/file" => &["path", "session_id"],
        "/fs/dirs" => &["path"],
        "/fs/tree" => &["limit", "session_id"],
        "/skills" => &["session_id"],
        "/permissions/rules" | "/permissions/rules/{id}" => &["workspace"],
        "/memory/{note_id}" => &["scope"],
        "/search" => &["q", "limit", "all"],
        "/commitments" => &["all"],
        "/intent/explain" => &["prompt", "surface", "act", "horizon", "stakes", "evidence"],
        "/digest" => &["days"],
        "/doctor" => &["session"],
        "/sessions/{id}/receipts" => &["include"],
        "/sessions/{id}/launch/logs" => &["name", "tail"],
        "/pty" => super::pty::PARAMS,
        _ => &[],
    }
}

/// Route middleware: refuses a parameter its route does not read.
pub(crate) async fn refuse_unknown(req: Request, next: Next) -> Response {
    if let (Some(query), Some(route)) = (req.uri().query(), req.extensions().get::<MatchedPath>()) {
        if let Err(message) = check(route.as_str(), query) {
            return json_error(StatusCode::BAD_REQUEST, "invalid_argument", &message);
        }
    }
    next.run(req).await
}

fn check(route: &str, query: &str) -> Result<(), String> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query).map_err(|e| format!("malformed query string: {e}"))?;
    let allowed = params(route);
    for (key, _) in pairs {
        if !allowed.contains(&key.as_str()) && !ALWAYS.contains(&key.as_str()) {
            let known = if allowed.is_empty() {
                "it takes none".to_string()
            } else {
                format!("it takes {}", allowed.join(", "))
            };
            return Err(format!(
                "unknown query parameter {:?} for {route}: {known}",
                key.chars().take(64).collect::<String>()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameters_are_named() {
        assert!(check("/stream", "session=a&cursor=a:1&host=1&config=1&token=t").is_ok());
        let e = check("/stream", "sessions=a").unwrap_err();
        assert!(
            e.contains("\"sessions\"") && e.contains("session, host, config, cursor"),
            "{e}"
        );
        assert!(check("/sessions/{id}/events", "after=3").is_ok());
        assert!(check("/sessions/{id}/transcript", "after=3")
            .unwrap_err()
            .contains("it takes none"));
        assert!(check("/sessions", "token=x").is_ok());
        assert!(check("/commitments", "all=true").is_ok());
    }
}
