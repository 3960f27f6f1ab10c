//! The cluster rows (issue 14): a real 3-node NATS JetStream cluster and 3 `vak serve --bus` replicas, one session fanned out to SSE subscribers spread over the replicas, and a run's throughput to one subscriber on the owning replica against an embedded server.

use crate::scenarios::{self, Env, Latency, Throughput, Transport};
use crate::server::{self, ServeOpts, Server};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the cluster may take to elect its JetStream meta leader.
const READY: Duration = Duration::from_secs(30);

/// The nats-server binary, found like the Makefile finds it: `VAK_NATS_SERVER`,
/// else `target/nats-venv/bin/nats-server` (next to the bench's own target
/// folder, or under the working directory), which `make nats` installs.
pub(crate) fn nats_server(exe: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VAK_NATS_SERVER") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let venv = Path::new("nats-venv/bin/nats-server");
    // target/release/vak-bench -> target/nats-venv/bin/nats-server
    let beside = exe.parent().and_then(Path::parent).map(|t| t.join(venv));
    beside
        .into_iter()
        .chain([Path::new("target").join(venv)])
        .find(|p| p.is_file())
}

/// Three nats-server nodes with JetStream, routed to each other on loopback
/// ports, each with its store in the cluster's temp folder; killed and
/// removed when dropped.
struct Nats {
    nodes: Vec<tokio::process::Child>,
    ports: Vec<u16>,
    dir: PathBuf,
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

impl Nats {
    async fn start(bin: &Path) -> Result<Nats, String> {
        // A folder per cluster: a killed node of the last one may still be exiting.
        static CLUSTERS: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vak-bench-nats-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut ports = Vec::new();
        let mut routes = Vec::new();
        for _ in 0..3 {
            ports.push(free_port()?);
            routes.push(free_port()?);
        }
        let all_routes = routes
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nats = Nats {
            nodes: Vec::new(),
            ports: ports.clone(),
            dir: dir.clone(),
        };
        for i in 0..3 {
            let name = format!("n{i}");
            let log = std::fs::File::create(dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
            let child = tokio::process::Command::new(bin)
                .args(["-a", "127.0.0.1", "-p", &ports[i].to_string(), "-n", &name, "-js"])
                .arg("-sd")
                .arg(dir.join(&name))
                .args(["--cluster_name", "vak-bench", "--cluster"])
                .arg(format!("nats://127.0.0.1:{}", routes[i]))
                .args(["--routes", &all_routes])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
            nats.nodes.push(child);
        }
        let deadline = Instant::now() + READY;
        for i in 0..3 {
            while !nats.ready(i).await {
                if Instant::now() > deadline {
                    return Err(format!(
                        "the NATS cluster has no JetStream meta leader after {READY:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(nats)
    }

    fn url(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether node `i` answers `$JS.API.INFO` without an error (a meta leader is elected).
    async fn ready(&self, i: usize) -> bool {
        let Ok(client) = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(1))
            .connect(format!("nats://127.0.0.1:{}", self.ports[i]))
            .await
        else {
            return false;
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            client.request("$JS.API.INFO", bytes::Bytes::new()),
        )
        .await;
        matches!(answer, Ok(Ok(msg))
            if serde_json::from_slice::<serde_json::Value>(&msg.payload)
                .is_ok_and(|v| v.get("error").is_none() && v.get("type").is_some()))
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one cluster run measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClusterRun {
    /// `/burst` to the subscribers spread over the 3 replicas.
    pub fanout: Throughput,
    /// `/pace` at the paced rate to the same spread.
    pub latency: Latency,
    /// `/burst` to one subscriber on the owning replica, and on an embedded server.
    pub one: Throughput,
    pub embedded: Throughput,
}

/// The sizes of a cluster run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClusterSizes {
    pub subs: usize,
    pub burst: u64,
    pub pace: u64,
    pub rate: u64,
    pub one_burst: u64,
}

/// One cluster run: 3 nats nodes, 3 replicas (`--bus-replicas 3`, one token),
/// a fresh session per figure, all made and run on replica 0 (which takes
/// its lease, so it owns them); then the embedded server for the ratio.
pub(crate) async fn run(env: &Env, nats_bin: &Path, sz: ClusterSizes) -> Result<ClusterRun, String> {
    let nats = Nats::start(nats_bin).await?;
    let token = server::random_token();
    let mut replicas = Vec::new();
    for i in 0..3 {
        let extra: Vec<String> = [
            "--bus",
            &nats.url(),
            "--bus-replicas",
            "3",
            "--bus-replica",
            &format!("bench{i}"),
        ]
        .map(str::to_string)
        .into();
        match Server::start_with(env, Transport::Sse, ServeOpts::default(), &extra, Some(&token)).await {
            Ok(s) => replicas.push(s),
            Err(e) => {
                for r in replicas {
                    r.stop().await;
                }
                return Err(format!("replica {i}: {e}"));
            }
        }
    }
    let all: Vec<&Server> = replicas.iter().collect();
    let r = async {
        let fanout = scenarios::burst_on(env, &all, sz.subs, sz.burst).await?;
        let latency = scenarios::paced_on(env, &all, Transport::Sse, sz.subs, sz.pace, sz.rate).await?;
        let one = scenarios::burst_on(env, &all[..1], 1, sz.one_burst).await?;
        Ok::<_, String>((fanout, latency, one))
    }
    .await;
    for s in replicas {
        s.stop().await;
    }
    drop(nats);
    let (fanout, latency, one) = r?;
    let embedded =
        scenarios::fanout(env, Transport::Sse, 1, sz.one_burst, false, ServeOpts::default()).await?;
    Ok(ClusterRun {
        fanout,
        latency,
        one,
        embedded,
    })
}
