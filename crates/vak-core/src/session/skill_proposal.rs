//! A skill proposal a person asks for from a session's messages (`POST /skills/proposals`).

impl crate::session::live::Session {
    /// A skill proposal a person asked for, from this session's messages
    /// with seq in `range` (inclusive; None: the whole session).
    pub async fn propose_skill(
        &self,
        range: Option<(u64, u64)>,
        name: Option<String>,
    ) -> crate::error::Result<crate::host::skills::Proposal> {
        let (from, upto) = match range {
            Some((a, b)) if a > b || a == 0 => {
                return Err(crate::error::Error::invalid(format!(
                    "seq_range {a}..={b} is empty: from must be at least 1 and at most to"
                )))
            }
            Some((a, b)) => (a - 1, b),
            None => (0, u64::MAX),
        };
        let shape = crate::host::skills::RunShape::from_transcript(
            self.id(),
            self.workspace(),
            &self.transcript(),
            from,
            upto,
        );
        let skills = self.runtime().skills().clone();
        tokio::task::spawn_blocking(move || skills.propose(&shape, name.as_deref()))
            .await
            .map_err(|e| crate::error::Error::internal(e.to_string()))?
    }
}
