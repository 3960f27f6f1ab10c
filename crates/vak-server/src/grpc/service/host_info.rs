//! What GetHost answers and `/stream`'s host frames carry: the version, the workspaces, what the edge allows, the storage and the sandbox.

use super::AgentApi;
use crate::grpc::convert;
use vak_proto::v1 as pb;

impl AgentApi {
    /// What GetHost answers and /stream's host frames carry.
    pub(super) fn host_info(&self) -> pb::HostInfo {
        let ws = self.control().workspaces();
        let cfg = self.control().config();
        pb::HostInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            workspace: ws.primary().path.display().to_string(),
            workspaces: ws.list().into_iter().map(convert::workspace).collect(),
            workspace_roots: ws.roots().iter().map(|r| r.display().to_string()).collect(),
            max_workspaces: vak_core::host::workspaces::MAX_OPEN as u32,
            features: Some(pb::HostFeatures {
                terminal: self.host.web.terminal,
                terminal_requires_loopback: self.host.web.terminal_requires_loopback,
                tls: self.host.tls,
            }),
            auth: if self.host.allow_remote {
                pb::AuthMode::Remote
            } else {
                pb::AuthMode::Local
            } as i32,
            storage: if cfg.nats.is_some() {
                pb::StorageKind::Jetstream
            } else {
                pb::StorageKind::Ledger
            } as i32,
            replica: cfg
                .owners
                .as_ref()
                .map(|o| o.replica().to_string())
                .unwrap_or_default(),
            sandbox: Some(convert::sandbox(self.control().sandbox())),
        }
    }
}
