//! The dev-server RPCs: a session workspace's launch configs, started and stopped in their own process groups, and their output.

use super::AgentApi;
use crate::errors::to_status;
use crate::grpc::enums;
use std::path::PathBuf;
use std::sync::Arc;
use tonic::Status;
use vak_core::host::launch::config::Source;
use vak_core::host::launch::run;
use vak_core::session::live::Session;
use vak_proto::v1 as pb;

fn source(s: Source) -> pb::LaunchSource {
    match s {
        Source::LaunchToml => pb::LaunchSource::LaunchToml,
        Source::Npm => pb::LaunchSource::Npm,
    }
}

impl AgentApi {
    /// The session and its workspace, re-checked like tools do.
    async fn launch_session(&self, id: &str) -> Result<(Arc<Session>, PathBuf), Status> {
        let s = self.session(id).await?;
        s.runtime().check_workspace().await.map_err(to_status)?;
        let ws = s.workspace_dir().to_path_buf();
        Ok((s, ws))
    }

    pub(super) async fn launch_list(
        &self,
        r: pb::ListLaunchRequest,
    ) -> Result<pb::ListLaunchResponse, Status> {
        let (s, ws) = self.launch_session(&r.session_id).await?;
        let listed = self
            .sessions()
            .launches()
            .list(s.id(), &ws)
            .await
            .map_err(to_status)?;
        Ok(pb::ListLaunchResponse {
            configs: listed
                .into_iter()
                .map(|l| pb::LaunchConfig {
                    name: l.config.name,
                    command: l.config.command,
                    cwd: l.config.cwd,
                    env: l.config.env.into_iter().collect(),
                    source: source(l.config.source) as i32,
                    running: l.running,
                    pid: l.pid,
                    started_at: l.started_at,
                    exit_code: l.exit_code,
                })
                .collect(),
        })
    }

    pub(super) async fn launch_start(&self, r: pb::StartLaunchRequest) -> Result<pb::LaunchStarted, Status> {
        let (s, ws) = self.launch_session(&r.session_id).await?;
        let mut withheld: Vec<String> = vak_core::tools::sandbox::WITHHELD_ENV
            .iter()
            .map(|k| k.to_string())
            .collect();
        withheld.extend(s.runtime().cfg.sandbox.scrub_env.iter().cloned());
        let (name, pid) = self
            .sessions()
            .launches()
            .start(s.id(), &ws, &r.name, withheld)
            .await
            .map_err(to_status)?;
        Ok(pb::LaunchStarted { name, pid })
    }

    pub(super) async fn launch_stop(&self, r: pb::StopLaunchRequest) -> Result<pb::LaunchStopped, Status> {
        let (s, ws) = self.launch_session(&r.session_id).await?;
        let was_running = self
            .sessions()
            .launches()
            .stop(s.id(), &ws, &r.name)
            .await
            .map_err(to_status)?;
        Ok(pb::LaunchStopped {
            name: r.name,
            was_running,
        })
    }

    pub(super) async fn launch_logs(&self, r: pb::GetLaunchLogsRequest) -> Result<pb::LaunchLogs, Status> {
        let (s, ws) = self.launch_session(&r.session_id).await?;
        let logs = self
            .sessions()
            .launches()
            .logs(s.id(), &ws, &r.name, r.tail as usize)
            .await
            .map_err(to_status)?;
        Ok(pb::LaunchLogs {
            name: logs.name,
            lines: logs
                .lines
                .into_iter()
                .map(|(stream, text)| pb::LaunchLine {
                    stream: enums::output_stream(stream) as i32,
                    text,
                })
                .collect(),
            running: logs.running,
            max_lines: run::MAX_LINES as u32,
            max_bytes: run::MAX_BYTES as u32,
            dropped: logs.dropped,
        })
    }
}
