//! Where task definitions persist: the `TaskPersist` trait, the home's tasks.json (`FileTasks`, rewritten atomically) and an in-memory store for tests and embedders.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::task::TaskDef;
use crate::{Error, Result};

/// Tasks a server keeps, at most.
pub const MAX_TASKS: usize = 256;

/// Loads and saves every task at once; the scheduler's owner task is the
/// only caller, so calls never overlap.
pub trait TaskPersist: Send + Sync + 'static {
    fn load(&self) -> Result<Vec<TaskDef>>;
    fn save(&self, tasks: &[TaskDef]) -> Result<()>;
}

/// The file's shape: an object, so fields can be added beside the list.
#[derive(Serialize, Deserialize)]
struct TasksFile {
    tasks: Vec<TaskDef>,
}

/// `home/tasks.json`, mode 0600, rewritten through a temporary file, fsync
/// and rename, so a crash leaves the old list or the new one.
#[derive(Clone, Debug)]
pub struct FileTasks {
    dir: PathBuf,
}

impl FileTasks {
    pub const FILE: &'static str = "tasks.json";

    pub fn new(home: &Path) -> FileTasks {
        FileTasks {
            dir: home.to_path_buf(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(Self::FILE)
    }
}

impl TaskPersist for FileTasks {
    /// An absent file is no tasks; one that does not parse is an error
    /// naming it (the server refuses to start rather than lose the tasks
    /// by rewriting them).
    fn load(&self) -> Result<Vec<TaskDef>> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
        };
        let file: TasksFile = serde_json::from_slice(&bytes)
            .map_err(|e| Error::internal(format!("{} is not a task list: {e}", path.display())))?;
        Ok(file.tasks)
    }

    fn save(&self, tasks: &[TaskDef]) -> Result<()> {
        let path = self.path();
        let err = |e: std::io::Error| Error::internal(format!("cannot write {}: {e}", path.display()));
        let file = TasksFile {
            tasks: tasks.to_vec(),
        };
        let mut bytes = serde_json::to_vec_pretty(&file)
            .map_err(|e| Error::internal(format!("cannot encode the tasks: {e}")))?;
        bytes.push(b'\n');
        let tmp = self.dir.join(format!(".{}.tmp", Self::FILE));
        // A leftover from a crash would make create_new fail.
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(err)?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(err)?;
        // The rename itself survives a power loss once the directory is synced.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        Ok(())
    }
}

/// Tasks held in memory: for tests, and for an embedder that keeps them
/// elsewhere. `fail_saves` makes every save fail (a full disk).
#[derive(Debug, Default)]
pub struct MemoryTasks {
    tasks: Mutex<Vec<TaskDef>>,
    fail_saves: AtomicBool,
}

impl MemoryTasks {
    pub fn new(tasks: Vec<TaskDef>) -> MemoryTasks {
        MemoryTasks {
            tasks: Mutex::new(tasks),
            fail_saves: AtomicBool::new(false),
        }
    }

    /// What the last successful save wrote.
    pub fn snapshot(&self) -> Vec<TaskDef> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn fail_saves(&self, fail: bool) {
        self.fail_saves.store(fail, Ordering::SeqCst);
    }
}

impl TaskPersist for MemoryTasks {
    fn load(&self) -> Result<Vec<TaskDef>> {
        Ok(self.snapshot())
    }

    fn save(&self, tasks: &[TaskDef]) -> Result<()> {
        if self.fail_saves.load(Ordering::SeqCst) {
            return Err(Error::internal(
                "cannot write the tasks: the store refuses (test)",
            ));
        }
        *self.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks.to_vec();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::automation::task::{NewTask, TaskBody};

    fn task(name: &str) -> TaskDef {
        NewTask {
            name: name.into(),
            script: Some("echo hi".into()),
            schedule: Some("*/5 * * * *".into()),
            workspace: "/tmp".into(),
            ..NewTask::default()
        }
        .into_def(
            crate::automation::task::new_task_id(),
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap()
    }

    #[test]
    fn an_absent_file_is_no_tasks_and_a_save_reads_back_owner_only() {
        let home = tempfile::tempdir().unwrap();
        let store = FileTasks::new(home.path());
        assert_eq!(store.load().unwrap(), Vec::<TaskDef>::new());
        let tasks = vec![task("a"), task("b")];
        store.save(&tasks).unwrap();
        assert_eq!(store.load().unwrap(), tasks);
        let mode = std::fs::metadata(store.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(text.contains("\"script\": \"echo hi\""), "{text}");
        // A rewrite replaces the whole list and leaves no temporary file.
        store.save(&tasks[1..]).unwrap();
        assert_eq!(store.load().unwrap(), tasks[1..]);
        let names: Vec<_> = std::fs::read_dir(home.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["tasks.json"]);
        assert!(matches!(tasks[0].body, TaskBody::Script(_)));
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it() {
        let home = tempfile::tempdir().unwrap();
        let store = FileTasks::new(home.path());
        std::fs::write(store.path(), b"{\"tasks\": [ {\"id\": 3").unwrap();
        let e = store.load().unwrap_err();
        assert!(
            e.message.contains("tasks.json is not a task list"),
            "{}",
            e.message
        );
        std::fs::write(store.path(), b"[]").unwrap();
        assert!(store.load().is_err(), "a bare list is not the file's shape");
    }

    #[test]
    fn a_stale_temporary_file_does_not_stop_a_save() {
        let home = tempfile::tempdir().unwrap();
        let store = FileTasks::new(home.path());
        std::fs::write(home.path().join(".tasks.json.tmp"), b"half").unwrap();
        store.save(&[task("a")]).unwrap();
        assert_eq!(store.load().unwrap().len(), 1);
    }
}
