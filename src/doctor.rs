//! `vak doctor`: the running server's `/doctor` report for a terminal (coloured only on a tty), exiting 1 when any check fails.

use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;
use vak_core::error::{Error, Result};
use vak_core::home;

/// `vak doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The data home of the running server (default ~/.local/share/vak).
    #[arg(long, env = "VAK_HOME")]
    pub home: Option<PathBuf>,
    /// Also read this session's ledger end to end.
    #[arg(long)]
    pub session: Option<String>,
    /// Print the report as JSON (what GET /doctor answers).
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; the exit code is 1 when a check failed (or no server answered), else 0.
pub async fn run(args: DoctorArgs) -> Result<i32> {
    let home = home::resolve(args.home)?;
    let Some(info) = home::read_server_json(&home) else {
        println!(
            "fail  server      no server is running in the home {}: start one with `vak serve`",
            home.display()
        );
        return Ok(1);
    };
    let mut req = crate::open::client_for(&home, &info)?
        .get(format!("{}/doctor", info.url))
        .bearer_auth(&info.token);
    if let Some(s) = &args.session {
        req = req.query(&[("session", s)]);
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            println!(
                "fail  server      cannot reach the server at {} ({e}); is it still running?",
                info.url
            );
            return Ok(1);
        }
    };
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no reason given");
        return Err(Error::invalid(format!(
            "the server at {} answered HTTP {}: {message}",
            info.url,
            status.as_u16()
        )));
    }
    if args.json {
        println!("{body}");
    } else {
        print!("{}", render(&info.url, &body, std::io::stdout().is_terminal()));
    }
    let failed = body["checks"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["status"] == "fail"));
    Ok(i32::from(failed))
}

/// The report as lines: `status  name  detail`, the status coloured when `colour`.
fn render(url: &str, body: &serde_json::Value, colour: bool) -> String {
    let facts = &body["facts"];
    let mut out = format!(
        "vak doctor: {url} (vak {})\n",
        facts["version"].as_str().unwrap_or("?")
    );
    for c in body["checks"].as_array().into_iter().flatten() {
        let status = c["status"].as_str().unwrap_or("?");
        let shown = format!("{status:<5}");
        let shown = match (colour, status) {
            (false, _) => shown,
            (true, "ok") => format!("\x1b[32m{shown}\x1b[0m"),
            (true, "warn") => format!("\x1b[33m{shown}\x1b[0m"),
            (true, _) => format!("\x1b[31m{shown}\x1b[0m"),
        };
        out.push_str(&format!(
            "{shown} {:<11} {}\n",
            c["name"].as_str().unwrap_or("?"),
            c["detail"].as_str().unwrap_or("")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_plain_unless_coloured() {
        let body = serde_json::json!({
            "checks": [{"name": "home", "status": "ok", "detail": "writable"},
                       {"name": "provider", "status": "fail", "detail": "unreachable"}],
            "facts": {"version": "0.1.0"}
        });
        let plain = render("http://x", &body, false);
        assert_eq!(
            plain,
            "vak doctor: http://x (vak 0.1.0)\nok    home        writable\nfail  provider    unreachable\n"
        );
        assert!(!plain.contains('\x1b'));
        assert!(render("http://x", &body, true).contains("\x1b[31mfail \x1b[0m"));
    }
}
