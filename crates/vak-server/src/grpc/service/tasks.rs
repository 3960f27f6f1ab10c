//! The task RPCs: scheduled tasks' CRUD and run-now, mapped onto the core's scheduler.

use super::AgentApi;
use crate::errors::to_status;
use tonic::Status;
use vak_core::automation::scheduler::{TaskError, TaskView};
use vak_core::automation::task::{NewTask, TaskBody, TaskOutcome, TaskPatch};
use vak_core::host::config;
use vak_core::host::workspaces::OpenWorkspace;
use vak_core::Error;
use vak_proto::v1 as pb;

/// A task error as the wire says it: a refused field names itself first.
fn task_error(e: TaskError) -> Status {
    to_status(match e {
        TaskError::NotFound => Error::not_found("no task with that id").with_reason("task_not_found"),
        TaskError::Invalid(f) => Error::invalid(format!("{}: {}", f.field, f.message)),
        TaskError::Full => Error::new(
            vak_core::ErrorKind::ResourceExhausted,
            format!(
                "tasks_full: this server keeps at most {} tasks; delete one first",
                vak_core::automation::store::MAX_TASKS
            ),
        ),
        TaskError::Store(e) => e,
    })
}

fn outcome(o: TaskOutcome) -> pb::TaskOutcome {
    match o {
        TaskOutcome::Started => pb::TaskOutcome::Started,
        TaskOutcome::Queued => pb::TaskOutcome::Queued,
        TaskOutcome::Duplicate => pb::TaskOutcome::Duplicate,
        TaskOutcome::Delivered => pb::TaskOutcome::Delivered,
        TaskOutcome::Silent => pb::TaskOutcome::Silent,
        TaskOutcome::ScriptFailed => pb::TaskOutcome::ScriptFailed,
        TaskOutcome::ScriptTimeout => pb::TaskOutcome::ScriptTimeout,
        TaskOutcome::BudgetExceeded => pb::TaskOutcome::BudgetExceeded,
        TaskOutcome::Failed => pb::TaskOutcome::Failed,
    }
}

pub(crate) fn task(v: TaskView) -> pb::Task {
    let d = v.def;
    let (prompt, script) = match d.body {
        TaskBody::Prompt(p) => (Some(p), None),
        TaskBody::Script(s) => (None, Some(s)),
    };
    pb::Task {
        id: d.id,
        name: d.name,
        prompt,
        script,
        schedule: d.schedule,
        session_id: d.session_id,
        model_pin: d.model_pin,
        enabled: d.enabled,
        next_fire: v.next_fire.as_ref().map(zoned),
        last_fire: d.last_fire.map(|l| pb::TaskFire {
            at: l.at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            outcome: outcome(l.outcome) as i32,
            slot: l.slot,
            session_id: l.session_id.unwrap_or_default(),
            message: l.message,
        }),
        workspace: d.workspace.display().to_string(),
        created_at: d.created_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }
}

/// A zoned time as RFC 3339 with its offset.
pub(super) fn zoned(z: &jiff::Zoned) -> String {
    z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
}

/// An empty string clears an optional field in a PATCH.
fn clearable(v: Option<String>) -> Option<Option<String>> {
    v.map(|s| (!s.is_empty()).then_some(s))
}

impl AgentApi {
    fn scheduler(&self) -> &vak_core::automation::scheduler::SchedulerHandle {
        self.hub.tasks()
    }

    /// A pin names a model of the route's provider ("provider/model" or
    /// "model"); it is checked against the provider's list when the list can
    /// be had (a provider that cannot be reached now does not stop a task
    /// from being written).
    async fn check_pin(&self, pin: &str) -> Result<(), Status> {
        let bad = |m: String| to_status(Error::invalid(format!("model_pin: {m}")));
        let settings = self.control().settings();
        let (spec, _) = settings.current();
        let model = match pin.split_once('/') {
            Some((p, m)) => {
                let kind = config::parse_provider(p, "model_pin").map_err(|e| bad(e.message))?;
                if kind != spec.provider {
                    return Err(bad(format!(
                        "{pin} is on {}, but tasks run on the route's provider, {}",
                        kind.as_str(),
                        spec.provider.as_str()
                    )));
                }
                m
            }
            None => pin,
        };
        config::validate_model(model, "model_pin").map_err(|e| bad(e.message))?;
        match settings.list_models(spec.provider).await {
            Ok(models) if !models.iter().any(|m| m.id == model) => Err(bad(format!(
                "unknown model {model:?} for provider {} (GET /providers/{}/models lists them)",
                spec.provider.as_str(),
                spec.provider.as_str()
            ))),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    pin,
                    "model_pin not checked: the model list is out of reach: {}",
                    e.message
                );
                Ok(())
            }
        }
    }

    pub(super) async fn tasks_list(
        &self,
        _req: pb::ListTasksRequest,
    ) -> Result<pb::ListTasksResponse, Status> {
        let s = self.scheduler();
        Ok(pb::ListTasksResponse {
            tasks: s
                .list()
                .await
                .map_err(task_error)?
                .into_iter()
                .map(task)
                .collect(),
            timezone: vak_core::zone::name(&s.timezone().await),
        })
    }

    pub(super) async fn tasks_create(&self, r: pb::CreateTaskRequest) -> Result<pb::TaskResponse, Status> {
        if let Some(pin) = r.model_pin.as_deref().filter(|p| !p.is_empty()) {
            self.check_pin(pin).await?;
        }
        let workspace = self.task_workspace(&r.workspace, r.session_id.as_deref()).await?;
        let mut session_id = r.session_id.filter(|s| !s.is_empty());
        // A script delivers to a session: one of its own when none is named
        // (made only for a task that is otherwise valid).
        let own_session = r.script.is_some() && r.prompt.is_none() && session_id.is_none();
        if own_session && !r.name.trim().is_empty() {
            let s = self
                .sessions()
                .create_in(Some(workspace.clone()))
                .await
                .map_err(to_status)?;
            let title: String = format!("task: {}", r.name.trim()).chars().take(100).collect();
            let _ = self.sessions().rename(s.id(), &title).await;
            session_id = Some(s.id().to_string());
        }
        let new = NewTask {
            name: r.name,
            prompt: r.prompt,
            script: r.script,
            schedule: r.schedule.filter(|s| !s.is_empty()),
            session_id,
            model_pin: r.model_pin.filter(|s| !s.is_empty()),
            enabled: r.enabled,
            workspace: workspace.path,
        };
        let v = self.scheduler().create(new).await.map_err(task_error)?;
        Ok(pb::TaskResponse { task: Some(task(v)) })
    }

    /// Where a new task runs: the workspace named, else its session's, else the server's own.
    async fn task_workspace(&self, asked: &str, session: Option<&str>) -> Result<OpenWorkspace, Status> {
        let find = |path: String| {
            let ws = self.control().workspaces().clone();
            async move {
                tokio::task::spawn_blocking(move || ws.find(&path))
                    .await
                    .map_err(|e| to_status(Error::internal(e.to_string())))?
                    .map_err(to_status)
            }
        };
        if !asked.is_empty() {
            return find(asked.to_string()).await?.ok_or_else(|| {
                to_status(
                    Error::invalid(
                        "workspace: no open workspace there: open it first (POST /workspaces/open)",
                    )
                    .with_reason("workspace_not_open"),
                )
            });
        }
        if let Some(id) = session.filter(|s| !s.is_empty()) {
            if let Ok(s) = self.sessions().get(id).await {
                if let Some(ws) = find(s.workspace_dir().display().to_string()).await? {
                    return Ok(ws);
                }
            }
        }
        Ok(self.control().workspaces().primary())
    }

    pub(super) async fn tasks_get(&self, r: pb::GetTaskRequest) -> Result<pb::TaskResponse, Status> {
        let v = self.scheduler().get(&r.task_id).await.map_err(task_error)?;
        Ok(pb::TaskResponse { task: Some(task(v)) })
    }

    pub(super) async fn tasks_update(&self, r: pb::UpdateTaskRequest) -> Result<pb::TaskResponse, Status> {
        if let Some(pin) = r.model_pin.as_deref().filter(|p| !p.is_empty()) {
            self.check_pin(pin).await?;
        }
        let patch = TaskPatch {
            name: r.name,
            prompt: r.prompt,
            script: r.script,
            schedule: clearable(r.schedule),
            session_id: clearable(r.session_id),
            model_pin: clearable(r.model_pin),
            enabled: r.enabled,
        };
        let v = self
            .scheduler()
            .update(&r.task_id, patch)
            .await
            .map_err(task_error)?;
        Ok(pb::TaskResponse { task: Some(task(v)) })
    }

    pub(super) async fn tasks_delete(
        &self,
        r: pb::DeleteTaskRequest,
    ) -> Result<pb::DeleteTaskResponse, Status> {
        self.scheduler().delete(&r.task_id).await.map_err(task_error)?;
        Ok(pb::DeleteTaskResponse { deleted: true })
    }

    pub(super) async fn tasks_run_now(&self, r: pb::RunTaskNowRequest) -> Result<pb::TaskResponse, Status> {
        let v = self.scheduler().run_now(&r.task_id).await.map_err(task_error)?;
        Ok(pb::TaskResponse { task: Some(task(v)) })
    }
}
