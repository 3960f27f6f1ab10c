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
}
