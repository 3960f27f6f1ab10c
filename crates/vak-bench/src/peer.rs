//! The peer: nginx with the nchan module (Debian's `nginx-light` and `libnginx-mod-nchan`), run as a child with its own config, pid, logs and temp paths, an SSE subscriber location and an HTTP publisher location; and the publisher the fan-out uses (pipelined HTTP/1.1 POSTs of vak-shaped text_delta JSON).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where Debian installs the module.
pub(crate) const MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";

/// Whether nginx and the nchan module are installed.
pub(crate) fn installed() -> bool {
    Path::new(MODULE).exists() && which("nginx").is_some()
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The subscriber and publisher locations: `/sub/<channel>` as EventSource
/// (nchan sends `: hi` on connect, then `event:` from the publisher's
/// `X-EventSource-Event` header, `id:` and one `data:` line per message),
/// `/pub/<channel>` takes one message per POST.
fn config(dir: &Path, port: u16, nofile: u64) -> String {
    let d = dir.display();
    format!(
        r#"load_module {MODULE};
daemon off;
master_process on;
# One worker: an event loop on one core (vak's runtime has a thread per core;
# both share the machine's cores with the bench's clients).
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections {nofile}; }}
http {{
  access_log off;
  # The publisher pipelines a whole burst on one connection (nginx closes a
  # connection after 1000 requests by default).
  keepalive_requests 100000000;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  # Enough for a 100000-message burst held for subscribers still reading it.
  nchan_shared_memory_size 1024m;
  server {{
    listen 127.0.0.1:{port};
    location ~ ^/pub/(\w+)$ {{
      nchan_publisher;
      nchan_channel_id $1;
      nchan_message_buffer_length 1000000;
      nchan_message_timeout 10m;
    }}
    location ~ ^/sub/(\w+)$ {{
      nchan_subscriber eventsource;
      nchan_channel_id $1;
    }}
  }}
}}
"#
    )
}

/// A running nginx: its master (killed when dropped) and its one worker.
pub(crate) struct Nginx {
    pub child: tokio::process::Child,
    pub worker: u32,
    pub port: u16,
}

/// A free loopback port (bound and released: nginx takes it a moment later).
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// This process's hard RLIMIT_NOFILE (what a worker that is not root can reach).
fn nofile_hard() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_max
    } else {
        1024
    }
}

/// The children of `pid` (its worker processes).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

impl Nginx {
    /// Starts nginx with its config in `dir`; waits until it accepts connections.
    pub(crate) async fn start(dir: &Path) -> Result<Nginx, String> {
        let port = free_port()?;
        // The worker may run as `nobody` when the bench runs as root.
        let nofile = nofile_hard().min(30_000);
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(dir, port, nofile)).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("nginx.out")).map_err(|e| e.to_string())?;
        let child = tokio::process::Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start nginx: {e}"))?;
        let master = child.id().unwrap_or(0);
        let start = Instant::now();
        loop {
            let worker = children(master).first().copied();
            if let (Some(worker), Ok(_)) = (worker, TcpStream::connect(("127.0.0.1", port)).await) {
                return Ok(Nginx { child, worker, port });
            }
            if start.elapsed() > Duration::from_secs(10) {
                let out = std::fs::read_to_string(dir.join("nginx.out")).unwrap_or_default();
                let err = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx did not start: {} {}", out.trim(), err.trim()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Requests written per `write` by the publisher.
const PUBLISH_BATCH: u64 = 512;

fn publish_request(channel: &str, event: &str, body: &str) -> String {
    format!(
        "POST /pub/{channel} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-EventSource-Event: {event}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Publishes `n` text_delta messages (`t{i} `, the JSON vak writes for a
/// delta) and then a run_finished, pipelined on one connection, and reads
/// every answer: the counterpart of vak's `Run("/burst n")`.
pub(crate) async fn publish(addr: std::net::SocketAddr, channel: String, n: u64) -> Result<(), String> {
    let channel = channel.as_str();
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("publisher: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr) = tcp.into_split();
    let answers = n + 1;
    let reader = tokio::spawn(async move {
        let mut seen = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        let mut tail: Vec<u8> = Vec::new();
        while seen < answers {
            let k = rd
                .read(&mut buf)
                .await
                .map_err(|e| format!("publisher read: {e}"))?;
            if k == 0 {
                return Err(format!(
                    "nchan closed the publisher after {seen} of {answers} answers"
                ));
            }
            tail.extend_from_slice(&buf[..k]);
            let mut at = 0;
            while let Some(i) = memchr::memmem::find(&tail[at..], b"HTTP/1.1 ") {
                let code = tail.get(at + i + 9..at + i + 12);
                let Some(code) = code else { break };
                if code[0] != b'2' {
                    return Err(format!(
                        "nchan refused a message: {}",
                        String::from_utf8_lossy(code)
                    ));
                }
                seen += 1;
                at += i + 12;
            }
            tail.drain(..at);
        }
        Ok::<(), String>(())
    });
    let mut i = 0u64;
    while i < n {
        let mut out = String::new();
        let end = (i + PUBLISH_BATCH).min(n);
        for k in i..end {
            let body = format!(
                r#"{{"seq":{},"session_id":"{channel}","text_delta":{{"text":"t{k} "}}}}"#,
                k + 1
            );
            out.push_str(&publish_request(channel, "text_delta", &body));
        }
        wr.write_all(out.as_bytes())
            .await
            .map_err(|e| format!("publisher write: {e}"))?;
        i = end;
    }
    wr.write_all(publish_request(channel, "run_finished", "{}").as_bytes())
        .await
        .map_err(|e| format!("publisher write: {e}"))?;
    reader.await.map_err(|e| e.to_string())?
}
