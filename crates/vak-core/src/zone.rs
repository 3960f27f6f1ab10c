//! The server's time zone: what schedules are read in and where a budget day begins and ends.

use jiff::tz::TimeZone;

/// `[automation] timezone` when set (an IANA name such as "Europe/Berlin",
/// or "UTC"), else the system's zone (TZ, then /etc/localtime), else UTC.
pub fn resolve(configured: Option<&str>) -> Result<TimeZone, String> {
    match configured {
        Some(name) => {
            TimeZone::get(name).map_err(|e| format!("[automation] timezone {name:?} is not a time zone: {e}"))
        }
        None => Ok(TimeZone::try_system().unwrap_or(TimeZone::UTC)),
    }
}

/// A zone's name for people and clients: its IANA name when it has one.
pub fn name(tz: &TimeZone) -> String {
    tz.iana_name()
        .map(str::to_owned)
        .unwrap_or_else(|| "UTC".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_zone_resolves_and_a_bad_one_is_refused_by_name() {
        let tz = resolve(Some("Europe/Berlin")).unwrap();
        assert_eq!(name(&tz), "Europe/Berlin");
        let e = resolve(Some("Mars/Olympus")).unwrap_err();
        assert!(e.contains("Mars/Olympus"), "{e}");
    }
}
