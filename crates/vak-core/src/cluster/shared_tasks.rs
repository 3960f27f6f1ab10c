//! Scheduled tasks with `--bus`: one task list every replica shares (signed, in VAK_CONFIG) and a claim per slot in a KV bucket, so exactly one replica fires each slot.

use crate::automation::scheduler::SlotClaim;
use crate::automation::store::TaskPersist;
use crate::automation::task::TaskDef;
use crate::cluster::shared_config::SharedConfig;
use crate::error::{Error, Result};
use async_nats::jetstream::kv;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// The bucket of slot claims.
pub(crate) const CLAIMS_BUCKET: &str = "VAK_TASK_CLAIMS";

/// How long a claim is kept: far longer than any replica's clock is off,
/// so a slot is never claimed twice; then the bucket forgets it.
const CLAIM_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a claim may take before the slot is left to others.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// The task list in VAK_CONFIG's `tasks` key. The scheduler saves from a
/// blocking thread; the bucket is written by a task of its own, which that
/// thread waits for.
pub(crate) struct SharedTasks {
    shared: Arc<SharedConfig>,
    writes: tokio::sync::mpsc::Sender<(Vec<u8>, tokio::sync::oneshot::Sender<Result<()>>)>,
}

impl SharedTasks {
    /// Starts the writer (inside a runtime).
    pub(crate) fn new(shared: Arc<SharedConfig>) -> SharedTasks {
        let (writes, mut rx) =
            tokio::sync::mpsc::channel::<(Vec<u8>, tokio::sync::oneshot::Sender<Result<()>>)>(1);
        let bucket = shared.clone();
        tokio::spawn(async move {
            while let Some((doc, done)) = rx.recv().await {
                let _ = done.send(bucket.put_tasks(doc).await);
            }
        });
        SharedTasks { shared, writes }
    }
}

impl TaskPersist for SharedTasks {
    fn load(&self) -> Result<Vec<TaskDef>> {
        match self.shared.tasks() {
            None => Ok(Vec::new()),
            Some(doc) => serde_json::from_slice(&doc)
                .map_err(|e| Error::internal(format!("the tasks in VAK_CONFIG are unreadable: {e}"))),
        }
    }

    fn save(&self, tasks: &[TaskDef]) -> Result<()> {
        let doc = serde_json::to_vec(tasks).map_err(|e| Error::internal(e.to_string()))?;
        let stopped = || Error::internal("the tasks' writer has stopped");
        let (done, answer) = tokio::sync::oneshot::channel();
        self.writes.blocking_send((doc, done)).map_err(|_| stopped())?;
        answer.blocking_recv().map_err(|_| stopped())?
    }
}

/// Opens the claims bucket (creating it with `replicas` copies if it is missing).
pub async fn open_claims(client: &async_nats::Client, replicas: usize) -> Result<kv::Store> {
    let mut config = crate::cluster::jetstream::bucket_config(
        CLAIMS_BUCKET,
        "vak: which replica fired each scheduled task's slot",
        256,
        replicas,
    );
    config.max_age = CLAIM_AGE;
    crate::cluster::jetstream::key_value(client, config).await
}

/// Claims a slot with a create in the claims bucket: the first replica's
/// create wins, every other one finds the key and skips the slot.
pub(crate) struct KvClaim {
    pub(crate) store: kv::Store,
    pub(crate) replica: String,
}

impl KvClaim {
    async fn claim_slot(&self, task_id: &str, slot: &str) -> Result<bool> {
        let key = format!("task/{task_id}/{slot}");
        let create = self.store.create(&key, self.replica.clone().into());
        match tokio::time::timeout(CLAIM_TIMEOUT, create).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Ok(Err(e)) => Err(Error::internal(format!("cannot claim {key}: {e}"))),
            Err(_) => Err(Error::internal(format!(
                "cannot claim {key}: no answer in {CLAIM_TIMEOUT:?}"
            ))),
        }
    }
}

impl SlotClaim for KvClaim {
    fn claim(&self, task_id: &str, slot: &str) -> BoxFuture<'_, bool> {
        let (task_id, slot) = (task_id.to_string(), slot.to_string());
        Box::pin(async move {
            match self.claim_slot(&task_id, &slot).await {
                Ok(won) => won,
                Err(e) => {
                    // Not fired here: a slot fired twice is worse than one
                    // missed, and the log says which.
                    tracing::warn!(task = %task_id, slot = %slot, "slot not fired: {}", e.message);
                    false
                }
            }
        })
    }
}
