//! `vak token` and `vak open`: the two ways a person gets from a running server to a logged-in /app without copying files around.
//!
//! `vak open` asks the server in the home (its server.json) for a one-time
//! login link (`POST /auth/ticket` with the token) and opens it. The link is
//! never put on a command line, where other users of the machine could read
//! it in /proc while it is still unused: the browser is given a private file
//! (`<home>/open.html`, mode 0600) that forwards to the link, as Jupyter does.

use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vak_core::error::{Error, ErrorKind, Result};
use vak_core::home;

/// `vak token`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The data home (default ~/.local/share/vak).
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
}

/// `vak open`.
#[derive(Args, Debug)]
pub struct OpenArgs {
    /// The data home of the running server (default ~/.local/share/vak).
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
    /// Print the link instead of opening a browser.
    #[arg(long)]
    pub print: bool,
}

/// Prints the token: the running server's, else the one kept in the home.
pub fn token(args: TokenArgs) -> Result<()> {
    let home = home::resolve(args.home)?;
    if let Some(info) = home::read_server_json(&home) {
        println!("{}", info.token);
        return Ok(());
    }
    match std::fs::read_to_string(home.join("token")) {
        Ok(t) if !t.trim().is_empty() => {
            println!("{}", t.trim());
            Ok(())
        }
        Ok(_) => Err(no_token(&home)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(no_token(&home)),
        Err(e) => Err(Error::internal(format!(
            "cannot read {}: {e}",
            home.join("token").display()
        ))),
    }
}

fn no_token(home: &Path) -> Error {
    Error::not_found(format!(
        "no token in the home {}: `vak serve` makes one when it first starts there",
        home.display()
    ))
}

/// Opens /app logged in, or prints the link with `--print`.
pub async fn open(args: OpenArgs) -> Result<()> {
    let home = home::resolve(args.home)?;
    let info = home::read_server_json(&home).ok_or_else(|| {
        Error::not_found(format!(
            "no server is running in the home {}: start one with `vak serve` (or `make serve`)",
            home.display()
        ))
    })?;
    let link = login_link(&home, &info).await?;
    if args.print {
        println!("{link}");
        println!("vak: the link works once, within 60 s");
        return Ok(());
    }
    let page = forwarding_page(&home, &link)?;
    match open_in_browser(&page) {
        Ok(how) => {
            println!("vak: opening {}/app/ logged in ({how})", info.url);
            Ok(())
        }
        Err(why) => {
            println!("vak: could not start a browser ({why}); open this link within 60 s (it works once):");
            println!("{link}");
            Ok(())
        }
    }
}

/// An HTTP client for the server in `home` (trusting its dev certificate when it serves TLS with one).
pub(crate) fn client_for(home: &Path, info: &home::ServerInfo) -> Result<reqwest::Client> {
    let mut client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none());
    // A --tls-self-signed server: trust its dev certificate from the home.
    if info.url.starts_with("https://") {
        if let Ok(pem) = std::fs::read(home.join("tls/dev-cert.pem")) {
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| Error::internal(format!("the home's dev certificate: {e}")))?;
            client = client.add_root_certificate(cert);
        }
    }
    client
        .build()
        .map_err(|e| Error::internal(format!("an HTTP client: {e}")))
}

/// Asks the server for a one-time login link.
async fn login_link(home: &Path, info: &home::ServerInfo) -> Result<String> {
    let resp = client_for(home, info)?
        .post(format!("{}/auth/ticket", info.url))
        .bearer_auth(&info.token)
        .send()
        .await
        .map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "cannot reach the server at {} ({e}); is it still running?",
                    info.url
                ),
            )
        })?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no reason given");
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "the server at {} refused a login link (HTTP {}): {message}",
                info.url,
                status.as_u16()
            ),
        ));
    }
    let path = body["path"]
        .as_str()
        .ok_or_else(|| Error::internal("the server's answer has no login link path"))?;
    Ok(format!("{}{path}", info.url))
}

/// Writes `<home>/open.html` (0600), a page that forwards to `link`.
fn forwarding_page(home: &Path, link: &str) -> Result<PathBuf> {
    // The link is ours (the server URL, a path, hex): still, keep it inert in HTML and JS.
    let quoted = serde_json::to_string(link)
        .unwrap_or_default()
        .replace('<', "\\u003c");
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>vak: opening the app</title></head>\n<body><p>Opening the vak app…</p><script>location.replace({quoted});</script></body></html>\n"
    );
    home::write_private_file(home, "open.html", html.as_bytes())?;
    Ok(home.join("open.html"))
}

/// Starts `$BROWSER`, else the desktop's opener, on `page`; says which.
fn open_in_browser(page: &Path) -> std::result::Result<String, String> {
    let mut tried = Vec::new();
    let browser = std::env::var("BROWSER").ok().filter(|b| !b.trim().is_empty());
    let candidates: Vec<String> = match browser {
        Some(b) => vec![b],
        None if cfg!(target_os = "macos") => vec!["open".into()],
        None => vec!["xdg-open".into()],
    };
    for program in candidates {
        match std::process::Command::new(&program)
            .arg(page)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(_) => return Ok(program),
            Err(e) => tried.push(format!("{program}: {e}")),
        }
    }
    Err(tried.join("; "))
}
