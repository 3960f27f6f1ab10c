//! The browser app (`/app`) and operations console (`/admin`): the bundle clients/web builds, embedded at build time, served with content-hash caching, precompressed gzip/brotli and a strict Content-Security-Policy.

use crate::errors::json_error;
use axum::extract::{FromRef, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use include_dir::{include_dir, Dir};
use std::collections::HashMap;
use std::sync::Arc;

/// What `make app` (`npm run build:app` in clients/web) writes. Without it the folder holds
/// only its .gitignore and `/app` answers with how to build it.
static EMBEDDED: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../clients/web/dist-app");

/// The one policy of every page and asset: nothing inline, nothing from elsewhere, no framing.
pub const CSP: &str = "default-src 'self'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'";
/// Hashed assets never change under their name.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// The shells name the current hashes, so the browser revalidates them every time.
const NO_CACHE: &str = "no-cache";
/// Hashed assets live here; everything else under /app is a client-side route.
const ASSETS: &str = "assets/";
/// The longest path under /app looked at (client-side routes are short).
const MAX_PATH: usize = 1024;

/// One file of the bundle with the encodings built next to it (`x.js.gz`, `x.js.br`).
#[derive(Clone)]
struct Asset {
    body: Bytes,
    gzip: Option<Bytes>,
    br: Option<Bytes>,
    mime: &'static str,
    /// A strong validator for the shells, which are revalidated on every load.
    etag: HeaderValue,
}

/// The files of a built bundle by their path inside it (`index.html`, `assets/app-HASH.js`).
pub struct Bundle {
    files: HashMap<String, Asset>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.files.keys().collect();
        names.sort();
        f.debug_struct("Bundle").field("files", &names).finish()
    }
}

impl Bundle {
    /// The bundle embedded in this binary (possibly not built).
    pub fn embedded() -> Bundle {
        let mut files = Vec::new();
        collect(&EMBEDDED, &mut files);
        Bundle::from_files(files)
    }

    /// A bundle from (path, bytes) pairs, `.gz` and `.br` files attached to the file they encode.
    pub fn from_files(files: impl IntoIterator<Item = (String, Bytes)>) -> Bundle {
        let all: HashMap<String, Bytes> = files.into_iter().collect();
        let mut out = HashMap::new();
        for (path, body) in &all {
            if path.ends_with(".gz") || path.ends_with(".br") || path.ends_with(".gitignore") {
                continue;
            }
            let digest = ring::digest::digest(&ring::digest::SHA256, body);
            let hex: String = digest.as_ref()[..12].iter().map(|b| format!("{b:02x}")).collect();
            let asset = Asset {
                body: body.clone(),
                gzip: all.get(&format!("{path}.gz")).cloned(),
                br: all.get(&format!("{path}.br")).cloned(),
                mime: mime_of(path),
                etag: HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header"),
            };
            out.insert(path.clone(), asset);
        }
        Bundle { files: out }
    }

    /// A bundle read from a folder laid out as dist-app (blocking: call it off the runtime).
    pub fn load(dir: &std::path::Path) -> std::io::Result<Bundle> {
        let mut files = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for entry in std::fs::read_dir(&d)? {
                let entry = entry?;
                let path = entry.path();
                if entry.file_type()?.is_dir() {
                    todo.push(path);
                } else if let Ok(rel) = path.strip_prefix(dir) {
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    files.push((rel, Bytes::from(std::fs::read(&path)?)));
                }
            }
        }
        Ok(Bundle::from_files(files))
    }

    /// Whether the app was built into this bundle.
    pub fn is_built(&self) -> bool {
        self.files.contains_key("index.html")
    }
}

fn collect(dir: &'static Dir<'static>, out: &mut Vec<(String, Bytes)>) {
    for f in dir.files() {
        out.push((
            f.path().to_string_lossy().replace('\\', "/"),
            Bytes::from_static(f.contents()),
        ));
    }
    for d in dir.dirs() {
        collect(d, out);
    }
}

fn mime_of(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("map" | "json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The routes of both pages: one registration in routes.rs.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Arc<Bundle>: FromRef<S>,
{
    Router::new()
        .route("/app", get(app_root))
        .route("/app/", get(app_root))
        .route("/app/{*path}", get(app_path))
        .route("/admin", get(admin))
        .route("/admin/", get(admin))
}

async fn app_root(State(app): State<Arc<Bundle>>, headers: HeaderMap) -> Response {
    shell(&app, "index.html", &headers)
}

async fn admin(State(app): State<Arc<Bundle>>, headers: HeaderMap) -> Response {
    shell(&app, "admin.html", &headers)
}

/// A hashed asset, or the app shell for a client-side route (`/app/s/<session>`).
async fn app_path(State(app): State<Arc<Bundle>>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    if !safe(&path) {
        return secured(json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "an /app path may not contain `..`, `.`, empty or encoded segments, backslashes or control characters",
        ));
    }
    if path.starts_with(ASSETS) {
        return match app.files.get(&path) {
            Some(asset) => file(asset, IMMUTABLE, &headers),
            None => secured(json_error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such asset in this build of the app (an older page? reload it)",
            )),
        };
    }
    shell(&app, "index.html", &headers)
}

/// No traversal, no encoded tricks: plain segments of printable ASCII only.
fn safe(path: &str) -> bool {
    path.len() <= MAX_PATH
        && path
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'\\' && b != b'%')
        && path.split('/').enumerate().all(|(i, seg)| {
            // A trailing slash (an empty last segment) is a route like any other.
            (!seg.is_empty() || i == path.split('/').count() - 1) && seg != "." && seg != ".."
        })
}

fn shell(bundle: &Bundle, name: &str, headers: &HeaderMap) -> Response {
    match bundle.files.get(name) {
        Some(asset) => file(asset, NO_CACHE, headers),
        None if bundle.is_built() => secured(json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("this build of the app has no {name}"),
        )),
        None => not_built(),
    }
}

/// Whether a request is a browser opening the console's page (GET /admin, HTML accepted).
pub fn is_console_page(req: &axum::extract::Request) -> bool {
    let path = req.uri().path();
    req.method() == axum::http::Method::GET
        && (path == "/admin" || path == "/admin/")
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

/// The console without credentials, for a browser: still a 401, with a way to log in.
pub fn console_login_page() -> Response {
    let body = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>vak admin: log in</title></head>\n<body><h1>Log in first</h1>\n<p>The console needs a login: <a href=\"/app/\">open the app</a>, log in with the token, then follow its <em>admin</em> link.</p></body></html>\n";
    page(StatusCode::UNAUTHORIZED, body, "no-store")
}

/// What `/app` and `/admin` answer when the binary was built without the bundle.
fn not_built() -> Response {
    let body = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>vak: the app is not built</title></head>\n<body><h1>The vak app is not built into this binary</h1>\n<p>This <code>vak</code> was compiled without the browser bundle. From the vak checkout, run <code>make serve</code> (it builds the bundle, then the server), or <code>make app</code> and then <code>cargo build</code> again.</p>\n<p>The API works without it: see docs/protocol.md.</p></body></html>\n";
    page(StatusCode::OK, body, NO_CACHE)
}

/// A small built-in HTML page (no script, no style), with the usual headers.
fn page(status: StatusCode, body: &'static str, cache: &'static str) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    secured(resp)
}

fn file(asset: &Asset, cache: &'static str, headers: &HeaderMap) -> Response {
    if cache == NO_CACHE && if_none_match(headers, &asset.etag) {
        let mut resp = StatusCode::NOT_MODIFIED.into_response();
        resp.headers_mut().insert(header::ETAG, asset.etag.clone());
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        return secured(resp);
    }
    let accepts = accepted(headers);
    let (body, encoding) = match (&asset.br, &asset.gzip) {
        (Some(br), _) if accepts.br => (br.clone(), Some("br")),
        (_, Some(gz)) if accepts.gzip => (gz.clone(), Some("gzip")),
        _ => (asset.body.clone(), None),
    };
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if cache == NO_CACHE {
        h.insert(header::ETAG, asset.etag.clone());
    }
    if let Some(e) = encoding {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(e));
    }
    if asset.br.is_some() || asset.gzip.is_some() {
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    secured(resp)
}

fn if_none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(v) = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let want = etag.to_str().unwrap_or_default();
    v.split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == want || t == "*")
}

#[derive(Debug, Default, PartialEq)]
struct Accepts {
    gzip: bool,
    br: bool,
}

/// Which of our two encodings `Accept-Encoding` allows (`q=0` refuses one; `*` names the rest).
fn accepted(headers: &HeaderMap) -> Accepts {
    let mut named = HashMap::new();
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(v) = value.to_str() else { continue };
        for item in v.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if !name.is_empty() {
                named.insert(name, q > 0.0);
            }
        }
    }
    let star = named.get("*").copied().unwrap_or(false);
    Accepts {
        gzip: named.get("gzip").copied().unwrap_or(star),
        br: named.get("br").copied().unwrap_or(star),
    }
}

/// The headers every answer under /app and /admin carries, errors included.
fn secured(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

/// The bundle a server serves: the embedded one unless the configuration names another.
pub fn bundle_or_embedded(custom: Option<Arc<Bundle>>) -> Arc<Bundle> {
    custom.unwrap_or_else(|| Arc::new(Bundle::embedded()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Accepts {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        accepted(&h)
    }

    #[test]
    fn accept_encoding_is_read_with_q_values() {
        assert_eq!(
            accept("gzip, deflate, br, zstd"),
            Accepts { gzip: true, br: true }
        );
        assert_eq!(
            accept("gzip"),
            Accepts {
                gzip: true,
                br: false
            }
        );
        assert_eq!(
            accept("br;q=0, gzip;q=0.5"),
            Accepts {
                gzip: true,
                br: false
            }
        );
        assert_eq!(accept("*"), Accepts { gzip: true, br: true });
        assert_eq!(
            accept("*;q=0.1, gzip;q=0"),
            Accepts {
                gzip: false,
                br: true
            }
        );
        assert_eq!(accept("identity"), Accepts::default());
        assert_eq!(accepted(&HeaderMap::new()), Accepts::default());
    }

    #[test]
    fn only_plain_segments_are_safe() {
        for ok in ["assets/app-1.js", "s/abc", "s/abc/", "admin"] {
            assert!(safe(ok), "{ok}");
        }
        for bad in [
            "../Cargo.toml",
            "assets/../../x",
            "assets/./x",
            "assets//x",
            "assets\\x",
            "%2e%2e/x",
            "a b",
            "..",
        ] {
            assert!(!safe(bad), "{bad}");
        }
    }

    #[test]
    fn encodings_attach_to_their_file() {
        let b = Bundle::from_files([
            ("index.html".to_string(), Bytes::from_static(b"<html>")),
            ("assets/a-1.js".to_string(), Bytes::from_static(b"js")),
            ("assets/a-1.js.gz".to_string(), Bytes::from_static(b"gz")),
            (".gitignore".to_string(), Bytes::from_static(b"*")),
        ]);
        assert!(b.is_built());
        let a = &b.files["assets/a-1.js"];
        assert_eq!(a.gzip.as_deref(), Some(&b"gz"[..]));
        assert!(a.br.is_none());
        assert!(!b.files.contains_key("assets/a-1.js.gz") && !b.files.contains_key(".gitignore"));
        assert!(!Bundle::from_files([]).is_built());
    }
}
