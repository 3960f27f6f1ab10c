//! Permission mode changes: one at a time on their owner task, each denying pending approvals and cancelling the runs of every live session, and with `--bus` taken up from (and shared with) the other replicas.

use super::{ControlPlane, ModeChange};
use crate::error::Result;
use crate::PermissionMode;
use std::sync::Arc;
use std::time::Duration;

/// How long a mode change waits for the runs it cancelled to settle.
const MODE_CHANGE_GRACE: Duration = Duration::from_secs(10);

impl ControlPlane {
    /// Switches the permission mode. A change denies every pending approval
    /// and cancels every run of every loaded session, and returns once those
    /// runs have settled and what they published is visible (all together
    /// bounded by `MODE_CHANGE_GRACE`); the same mode changes nothing. `bypass` needs a
    /// server that allows it.
    pub async fn set_mode(self: &Arc<Self>, mode: PermissionMode) -> Result<ModeChange> {
        mode.check(self.rt.bypass_allowed())?;
        let me = self.clone();
        self.mode_change
            .change(move |_| Box::pin(async move { me.set_mode_now(mode).await }))
            .await?
    }

    /// `set_mode` on the mode's owner task.
    async fn set_mode_now(&self, mode: PermissionMode) -> Result<ModeChange> {
        // With --bus every replica takes it up (`follow_shared_mode`).
        if let Some(shared) = &self.rt.cfg.shared_config {
            shared
                .put_mode(crate::cluster::shared_config::SharedMode {
                    mode,
                    interrupt: true,
                })
                .await?;
        }
        Ok(self.change_mode(mode).await)
    }

    /// With `--bus`: takes up every permission mode change made on another
    /// replica, as `set_mode` does here (a `POST /config/mode` denies this
    /// replica's pending approvals and cancels its runs too; an approved
    /// plan only switches), until the hub closes. A `bypass` this replica
    /// does not allow (no `--allow-bypass`) is not taken up, with a warning.
    pub async fn follow_shared_mode(self: Arc<Self>) {
        let Some(shared) = self.rt.cfg.shared_config.clone() else {
            return;
        };
        let mut changes = shared.mode_changes();
        loop {
            if let Some(m) = shared.mode() {
                if m.mode != self.rt.mode() {
                    if m.mode.check(self.rt.bypass_allowed()).is_err() {
                        tracing::warn!(
                            "another replica chose the bypass mode, which this replica does not allow (no --allow-bypass): staying in {}",
                            self.rt.mode().as_str()
                        );
                    } else if m.interrupt {
                        let me = self.clone();
                        let turn = self.mode_change.change(move |_| {
                            Box::pin(async move {
                                me.change_mode(m.mode).await;
                            })
                        });
                        if let Err(e) = turn.await {
                            tracing::warn!(
                                "a permission mode change on another replica is not taken up: {e}"
                            );
                        }
                    } else {
                        self.rt.set_mode(m.mode);
                    }
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = self.closing.cancelled() => return,
            }
        }
    }

    /// Switches the mode here, denying pending approvals and cancelling
    /// runs when it changed; runs on the `mode_change` owner's task.
    async fn change_mode(&self, mode: PermissionMode) -> ModeChange {
        let changed = self.rt.set_mode(mode);
        let (mut cancelled_runs, mut denied_approvals) = (0, 0);
        if changed {
            tracing::info!(mode = mode.as_str(), "permission mode changed");
            let reason = format!("the permission mode changed to {}", mode.as_str());
            let sessions = self.sessions.live();
            for s in &sessions {
                let (cancelled, denied) = s.interrupt(&reason);
                cancelled_runs += cancelled;
                denied_approvals += denied;
            }
            // One deadline for all of them: the answer waits at most the grace.
            let deadline = tokio::time::Instant::now() + MODE_CHANGE_GRACE;
            for s in &sessions {
                let settled = async {
                    s.settled().await;
                    // Visible (durable, on every stream) before the answer.
                    let _ = s.flush().await;
                };
                let _ = tokio::time::timeout_at(deadline, settled).await;
            }
        }
        ModeChange {
            config: self.config_info(),
            changed,
            cancelled_runs,
            denied_approvals,
        }
    }
}
