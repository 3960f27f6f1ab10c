//! `[automation]` in config.toml: the scheduler's time zone and whether a missed slot fires at startup.

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAutomation {
    /// An IANA zone name; absent: the system's zone (`zone::resolve`).
    #[serde(default)]
    pub timezone: Option<String>,
    /// Fire one missed slot per task at startup.
    #[serde(default)]
    pub catch_up_missed: bool,
    /// How long a script task may run before it is killed (a
    /// `script_timeout` alert); absent: 120 000.
    #[serde(default)]
    pub script_timeout_ms: Option<u64>,
}

impl FileAutomation {
    /// The script timeout, checked: 1 ms to 1 hour.
    pub fn script_timeout(&self) -> Result<std::time::Duration, String> {
        match self.script_timeout_ms {
            None => Ok(std::time::Duration::from_secs(120)),
            Some(ms) if (1..=3_600_000).contains(&ms) => Ok(std::time::Duration::from_millis(ms)),
            Some(ms) => Err(format!(
                "[automation] script_timeout_ms = {ms}: give 1 to 3600000 (an hour)"
            )),
        }
    }
}
