//! A scheduled task's definition as the home keeps it (tasks.json), the changes a client may make to it, and the checks a new or changed one must pass.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::cron::CronSchedule;

/// A task's name, in bytes, at most.
pub const MAX_NAME_BYTES: usize = 200;
/// A prompt, in bytes, at most.
pub const MAX_PROMPT_BYTES: usize = 32 * 1024;
/// A script, in bytes, at most.
pub const MAX_SCRIPT_BYTES: usize = 8 * 1024;

/// One task: what it runs, when, where its results go and what its last
/// fire did. The JSON has `prompt` or `script` at the top level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDef {
    /// "task_" and 12 hex digits.
    pub id: String,
    pub name: String,
    #[serde(flatten)]
    pub body: TaskBody,
    /// A 5-field cron expression read in the server's zone; absent: the
    /// task fires only when run now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The session a prompt runs in; absent: a new session per fire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The model this task's runs use ("<provider>/<model>").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_pin: Option<String>,
    pub enabled: bool,
    /// Where a script runs and a new session works.
    pub workspace: PathBuf,
    pub created_at: Timestamp,
    /// The last scheduled slot handed to a fire (unix seconds), persisted
    /// before that fire starts, so a restart never fires it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_slot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire: Option<LastFire>,
}

/// What a task runs: a prompt for a model, or a shell command that never
/// touches one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskBody {
    Prompt(String),
    Script(String),
}

impl TaskBody {
    pub fn prompt(&self) -> Option<&str> {
        match self {
            TaskBody::Prompt(p) => Some(p),
            TaskBody::Script(_) => None,
        }
    }

    pub fn script(&self) -> Option<&str> {
        match self {
            TaskBody::Script(s) => Some(s),
            TaskBody::Prompt(_) => None,
        }
    }
}

/// What a task's latest fire did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastFire {
    pub at: Timestamp,
    pub outcome: TaskOutcome,
    /// The slot fired: unix seconds, or `now-<unix millis>` for a run-now.
    pub slot: String,
    /// The session the fire ran in or delivered to, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// For people: why it failed, what was refused; may be empty.
    #[serde(default)]
    pub message: String,
}

/// How a fire ended, as the wire spells it (`as_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    /// A prompt's run was admitted and started.
    Started,
    /// A prompt's run was admitted behind the session's current run.
    Queued,
    /// The slot's run was already admitted (same request id): no second run.
    Duplicate,
    /// A script's output was delivered.
    Delivered,
    /// A script printed nothing: nothing delivered.
    Silent,
    /// A script exited non-zero (alert delivered).
    ScriptFailed,
    /// A script ran past its time limit (alert delivered).
    ScriptTimeout,
    /// The day's budget is spent and `stop_at_limit` refused the fire.
    BudgetExceeded,
    /// The fire could not start (no such session, no model service, …).
    Failed,
}

impl TaskOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskOutcome::Started => "started",
            TaskOutcome::Queued => "queued",
            TaskOutcome::Duplicate => "duplicate",
            TaskOutcome::Delivered => "delivered",
            TaskOutcome::Silent => "silent",
            TaskOutcome::ScriptFailed => "script_failed",
            TaskOutcome::ScriptTimeout => "script_timeout",
            TaskOutcome::BudgetExceeded => "budget_exceeded",
            TaskOutcome::Failed => "failed",
        }
    }
}

impl std::fmt::Display for TaskOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task as a client creates it; exactly one of `prompt` and `script`.
#[derive(Clone, Debug, Default)]
pub struct NewTask {
    pub name: String,
    pub prompt: Option<String>,
    pub script: Option<String>,
    pub schedule: Option<String>,
    pub session_id: Option<String>,
    pub model_pin: Option<String>,
    /// Absent: enabled.
    pub enabled: Option<bool>,
    pub workspace: PathBuf,
}

/// A change to a task: `None` leaves a field as it is, `Some(None)` clears
/// an optional one. Setting `prompt` replaces a script and `script` a
/// prompt; setting both is refused.
#[derive(Clone, Debug, Default)]
pub struct TaskPatch {
    pub name: Option<String>,
    pub prompt: Option<String>,
    pub script: Option<String>,
    pub schedule: Option<Option<String>>,
    pub session_id: Option<Option<String>>,
    pub model_pin: Option<Option<String>>,
    pub enabled: Option<bool>,
}

/// A refused field: `field` is its wire name ("name", "prompt", "script",
/// "schedule", "session_id", "model_pin").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        FieldError {
            field,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

/// What validation asks of the rest of the server.
pub trait TaskCheck: Send + Sync {
    fn session_exists(&self, id: &str) -> bool;
    /// Whether a `model_pin` names a model this server can route to.
    fn model_known(&self, pin: &str) -> bool;
}

/// A new task id: "task_" and 12 hex digits.
pub fn new_task_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("task_{}", &hex[..12])
}

/// A body from a client's `prompt` and `script`: exactly one of them.
fn body_of(prompt: Option<String>, script: Option<String>) -> Result<TaskBody, FieldError> {
    match (prompt, script) {
        (Some(p), None) => Ok(TaskBody::Prompt(p)),
        (None, Some(s)) => Ok(TaskBody::Script(s)),
        (Some(_), Some(_)) => Err(FieldError::new(
            "prompt",
            "a task has a prompt or a script, not both",
        )),
        (None, None) => Err(FieldError::new("prompt", "a task needs a prompt or a script")),
    }
}

impl NewTask {
    /// The definition this asks for, not yet validated (`TaskDef::validate`);
    /// refused only when it has both or neither of prompt and script.
    pub fn into_def(self, id: String, created_at: Timestamp) -> Result<TaskDef, FieldError> {
        Ok(TaskDef {
            id,
            name: self.name,
            body: body_of(self.prompt, self.script)?,
            schedule: self.schedule,
            session_id: self.session_id,
            model_pin: self.model_pin,
            enabled: self.enabled.unwrap_or(true),
            workspace: self.workspace,
            created_at,
            last_slot: None,
            last_fire: None,
        })
    }
}

impl TaskDef {
    /// This task with `patch` applied, not yet validated; refused only when
    /// the patch sets both prompt and script.
    pub fn patched(&self, patch: TaskPatch) -> Result<TaskDef, FieldError> {
        let mut def = self.clone();
        if patch.prompt.is_some() || patch.script.is_some() {
            def.body = body_of(patch.prompt, patch.script)?;
        }
        if let Some(name) = patch.name {
            def.name = name;
        }
        if let Some(schedule) = patch.schedule {
            def.schedule = schedule;
        }
        if let Some(session_id) = patch.session_id {
            def.session_id = session_id;
        }
        if let Some(model_pin) = patch.model_pin {
            def.model_pin = model_pin;
        }
        if let Some(enabled) = patch.enabled {
            def.enabled = enabled;
        }
        Ok(def)
    }

    /// The checks a created or changed task passes, first failure first:
    /// name, prompt or script, schedule, session, model.
    pub fn validate(&self, check: &dyn TaskCheck) -> Result<(), FieldError> {
        if self.name.is_empty() || self.name.len() > MAX_NAME_BYTES {
            return Err(FieldError::new(
                "name",
                format!(
                    "a name is 1 to {MAX_NAME_BYTES} bytes; this one is {}",
                    self.name.len()
                ),
            ));
        }
        if self.name.chars().any(char::is_control) {
            return Err(FieldError::new("name", "a name has no control characters"));
        }
        let (field, text, max) = match &self.body {
            TaskBody::Prompt(p) => ("prompt", p, MAX_PROMPT_BYTES),
            TaskBody::Script(s) => ("script", s, MAX_SCRIPT_BYTES),
        };
        if text.trim().is_empty() || text.len() > max {
            return Err(FieldError::new(
                field,
                format!(
                    "a {field} is 1 to {max} bytes, not blank; this one is {}",
                    text.len()
                ),
            ));
        }
        if let Some(schedule) = &self.schedule {
            CronSchedule::parse(schedule).map_err(|e| FieldError::new("schedule", e))?;
        }
        if let Some(id) = &self.session_id {
            if !check.session_exists(id) {
                return Err(FieldError::new("session_id", format!("no session {id:?}")));
            }
        }
        if let Some(pin) = &self.model_pin {
            if !check.model_known(pin) {
                return Err(FieldError::new(
                    "model_pin",
                    format!("no model {pin:?} is configured"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Knows one session, "s1", and one model, "fake/m".
    struct Known;

    impl TaskCheck for Known {
        fn session_exists(&self, id: &str) -> bool {
            id == "s1"
        }
        fn model_known(&self, pin: &str) -> bool {
            pin == "fake/m"
        }
    }

    fn new_task() -> NewTask {
        NewTask {
            name: "nightly".into(),
            prompt: Some("summarise the day".into()),
            schedule: Some("0 22 * * MON-FRI".into()),
            session_id: Some("s1".into()),
            model_pin: Some("fake/m".into()),
            workspace: "/tmp/w".into(),
            ..NewTask::default()
        }
    }

    fn def() -> TaskDef {
        new_task().into_def(new_task_id(), Timestamp::UNIX_EPOCH).unwrap()
    }

    fn refused(def: &TaskDef) -> &'static str {
        def.validate(&Known).unwrap_err().field
    }

    #[test]
    fn a_good_task_passes_and_its_json_has_prompt_or_script_at_the_top() {
        let def = def();
        assert_eq!(def.validate(&Known), Ok(()));
        assert!(def.enabled);
        assert!(def.id.starts_with("task_") && def.id.len() == 17, "{}", def.id);
        assert!(def.id[5..].chars().all(|c| c.is_ascii_hexdigit()), "{}", def.id);
        let json = serde_json::to_value(&def).unwrap();
        assert_eq!(json["prompt"], "summarise the day");
        assert!(json.get("script").is_none(), "{json}");
        assert_eq!(json["created_at"], "1970-01-01T00:00:00Z");
        assert_eq!(serde_json::from_value::<TaskDef>(json).unwrap(), def);

        let mut script = def.clone();
        script.body = TaskBody::Script("df -h".into());
        script.last_slot = Some("1767225600".into());
        script.last_fire = Some(LastFire {
            at: Timestamp::UNIX_EPOCH,
            outcome: TaskOutcome::ScriptFailed,
            slot: "1767225600".into(),
            session_id: None,
            message: "exit 1".into(),
        });
        let json = serde_json::to_value(&script).unwrap();
        assert_eq!(json["script"], "df -h");
        assert!(json.get("prompt").is_none(), "{json}");
        assert_eq!(json["last_fire"]["outcome"], "script_failed");
        assert_eq!(serde_json::from_value::<TaskDef>(json).unwrap(), script);
    }

    #[test]
    fn outcomes_say_their_wire_names() {
        use TaskOutcome::*;
        for o in [
            Started,
            Queued,
            Duplicate,
            Delivered,
            Silent,
            ScriptFailed,
            ScriptTimeout,
            BudgetExceeded,
            Failed,
        ] {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
        }
        assert_eq!(BudgetExceeded.as_str(), "budget_exceeded");
    }

    #[test]
    fn neither_or_both_of_prompt_and_script_are_refused_as_prompt() {
        let both = NewTask {
            script: Some("ls".into()),
            ..new_task()
        };
        let e = both.into_def("task_0".into(), Timestamp::UNIX_EPOCH).unwrap_err();
        assert_eq!(e.field, "prompt");
        assert!(e.message.contains("not both"), "{e}");
        let neither = NewTask {
            prompt: None,
            ..new_task()
        };
        let e = neither
            .into_def("task_0".into(), Timestamp::UNIX_EPOCH)
            .unwrap_err();
        assert_eq!(e.field, "prompt");
        let patch = TaskPatch {
            prompt: Some("a".into()),
            script: Some("b".into()),
            ..TaskPatch::default()
        };
        assert_eq!(def().patched(patch).unwrap_err().field, "prompt");
    }

    #[test]
    fn each_bad_field_is_refused_by_its_wire_name() {
        let mut d = def();
        d.name = String::new();
        assert_eq!(refused(&d), "name");
        d.name = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(refused(&d), "name");
        d.name = "x".repeat(MAX_NAME_BYTES);
        assert_eq!(d.validate(&Known), Ok(()));
        d.name = "two\nlines".into();
        assert_eq!(refused(&d), "name");

        let mut d = def();
        d.body = TaskBody::Prompt(" \n".into());
        assert_eq!(refused(&d), "prompt");
        d.body = TaskBody::Prompt("p".repeat(MAX_PROMPT_BYTES + 1));
        assert_eq!(refused(&d), "prompt");
        d.body = TaskBody::Prompt("p".repeat(MAX_PROMPT_BYTES));
        assert_eq!(d.validate(&Known), Ok(()));
        d.body = TaskBody::Script(String::new());
        assert_eq!(refused(&d), "script");
        d.body = TaskBody::Script("s".repeat(MAX_SCRIPT_BYTES + 1));
        assert_eq!(refused(&d), "script");
        d.body = TaskBody::Script("s".repeat(MAX_SCRIPT_BYTES));
        assert_eq!(d.validate(&Known), Ok(()));

        let mut d = def();
        d.schedule = Some("61 * * * *".into());
        let e = d.validate(&Known).unwrap_err();
        assert_eq!(e.field, "schedule");
        assert!(e.message.starts_with("minute field \"61\""), "{e}");
        d.schedule = None;
        assert_eq!(d.validate(&Known), Ok(()));

        let mut d = def();
        d.session_id = Some("s2".into());
        assert_eq!(refused(&d), "session_id");
        d.session_id = None;
        assert_eq!(d.validate(&Known), Ok(()));

        let mut d = def();
        d.model_pin = Some("other/m".into());
        assert_eq!(refused(&d), "model_pin");
    }

    #[test]
    fn a_patch_replaces_the_body_and_clears_with_some_none() {
        let d = def();
        let p = d
            .patched(TaskPatch {
                script: Some("uptime".into()),
                schedule: Some(None),
                session_id: Some(None),
                enabled: Some(false),
                ..TaskPatch::default()
            })
            .unwrap();
        assert_eq!(p.body, TaskBody::Script("uptime".into()));
        assert_eq!(p.schedule, None);
        assert_eq!(p.session_id, None);
        assert_eq!(p.model_pin, d.model_pin, "untouched");
        assert!(!p.enabled);
        assert_eq!((p.id.as_str(), p.created_at), (d.id.as_str(), d.created_at));
        let back = p
            .patched(TaskPatch {
                prompt: Some("again".into()),
                ..TaskPatch::default()
            })
            .unwrap();
        assert_eq!(back.body.prompt(), Some("again"));
        assert_eq!(back.body.script(), None);
    }
}
