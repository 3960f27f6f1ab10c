//! The usage digest as the control plane answers it: the cost ledger's days, with the memory notes taken in the window.

use super::ControlPlane;
use crate::error::Result;
use crate::finops::{digest::check_days, DigestView, Finops};
use std::sync::Arc;

impl ControlPlane {
    /// Prices, the cost ledger and the daily budget.
    pub fn finops(&self) -> &Arc<Finops> {
        self.rt.finops()
    }

    /// The last `days` days (1 to 90, else an invalid-argument error naming
    /// `days`): spend and tokens per day, model and session, task fires, and
    /// the notes added to the server workspace's and the user's memory.
    pub async fn digest(&self, days: u32) -> Result<DigestView> {
        check_days(days)?;
        let created = self
            .memory()
            .list()
            .await?
            .into_iter()
            .map(|n| n.created_at)
            .collect();
        self.finops().digest(days, created).await
    }
}
