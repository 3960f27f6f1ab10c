//! The cost ledger's files: `<home>/costs/YYYY-MM-DD.jsonl`, one per server-local day, 0600, append-only; its rows, appending them, reading a day back (capped) and pruning old days.

use jiff::civil::Date;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Days kept: older files are removed at startup.
pub(crate) const KEEP_DAYS: i64 = 400;

/// The most one day's file may hold for a read: past it the read is an
/// error that says so (never a silent cut). A model call's row is ~250
/// bytes, so this is some 250,000 calls a day.
pub(crate) const MAX_DAY_FILE: u64 = 64 << 20;

/// One line of a day's file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Row {
    /// One model call.
    Usage {
        /// RFC 3339, UTC.
        at: String,
        session_id: String,
        /// The run (or side run) that made the call; None outside one (a
        /// compaction asked for by a client).
        request_id: Option<String>,
        provider: String,
        model: String,
        input_tokens: u64,
        output_tokens: u64,
        /// None: the model has no `[finops.prices]` entry (no price, no cost).
        usd: Option<f64>,
    },
    /// A level of the day's budget crossed: audit only (the alert itself
    /// went to the sessions). Read back at startup so a restart does not
    /// alert again.
    BudgetAlert {
        at: String,
        level: Level,
        day_usd: f64,
        max_day_usd: f64,
    },
    /// A scheduled task fired (the scheduler's record, counted by the digest).
    Fire {
        at: String,
        task_id: String,
        outcome: String,
    },
}

/// A budget level, in percent of `max_day_usd`: written as the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub(crate) enum Level {
    Eighty,
    Hundred,
}

impl Level {
    pub(crate) const ALL: [Level; 2] = [Level::Eighty, Level::Hundred];

    pub(crate) fn percent(self) -> u8 {
        match self {
            Level::Eighty => 80,
            Level::Hundred => 100,
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Level::Eighty => 0,
            Level::Hundred => 1,
        }
    }
}

impl From<Level> for u8 {
    fn from(l: Level) -> u8 {
        l.percent()
    }
}

impl TryFrom<u8> for Level {
    type Error = String;
    fn try_from(n: u8) -> Result<Level, String> {
        match n {
            80 => Ok(Level::Eighty),
            100 => Ok(Level::Hundred),
            _ => Err(format!("a budget level is 80 or 100, not {n}")),
        }
    }
}

/// The ledger's folder in the home.
pub(crate) fn dir(home: &Path) -> PathBuf {
    home.join("costs")
}

pub(crate) fn day_file(dir: &Path, date: Date) -> PathBuf {
    dir.join(format!("{date}.jsonl"))
}

/// Appends `rows` to `date`'s file (created 0600) in one write. Blocking.
pub(crate) fn append(dir: &Path, date: Date, rows: &[Row]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut buf = Vec::with_capacity(rows.len() * 256);
    for row in rows {
        serde_json::to_writer(&mut buf, row).map_err(std::io::Error::other)?;
        buf.push(b'\n');
    }
    crate::home::create_private_dir(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(day_file(dir, date))?;
    f.write_all(&buf)
}

/// Why a day could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The file is larger than `MAX_DAY_FILE`.
    TooLarge {
        path: PathBuf,
        len: u64,
    },
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooLarge { path, len } => write!(
                f,
                "the cost ledger {} holds {len} bytes, more than the {} MiB a day's file may hold to be read",
                path.display(),
                MAX_DAY_FILE >> 20
            ),
            ReadError::Io { path, error } => {
                write!(f, "cannot read the cost ledger {}: {error}", path.display())
            }
        }
    }
}

/// Every row of `date`'s file, in order (none when it does not exist).
/// A line that does not parse (a write torn by a crash) is skipped with a
/// log line. Blocking.
pub(crate) fn read_day(dir: &Path, date: Date) -> Result<Vec<Row>, ReadError> {
    let path = day_file(dir, date);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(ReadError::Io { path, error }),
    };
    let len = file
        .metadata()
        .map_err(|error| ReadError::Io {
            path: path.clone(),
            error,
        })?
        .len();
    if len > MAX_DAY_FILE {
        return Err(ReadError::TooLarge { path, len });
    }
    let mut rows = Vec::new();
    // Bounded by the cap above, also if the file grows meanwhile.
    let reader = std::io::BufReader::new(std::io::Read::take(file, MAX_DAY_FILE));
    for (n, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|error| ReadError::Io {
            path: path.clone(),
            error,
        })?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Row>(&line) {
            Ok(row) => rows.push(row),
            Err(e) => {
                tracing::warn!(file = %path.display(), line = n + 1, "a cost ledger line was skipped: {e}")
            }
        }
    }
    Ok(rows)
}

/// Removes the day files older than `KEEP_DAYS` before `today`; returns how
/// many. Other files in the folder are left alone. Blocking.
pub(crate) fn prune(dir: &Path, today: Date) -> usize {
    let Ok(oldest) = today.checked_sub(jiff::Span::new().days(KEEP_DAYS)) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(date) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|d| d.parse::<Date>().ok())
        else {
            continue;
        };
        if date < oldest {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(file = %entry.path().display(), "cannot prune an old cost ledger: {e}")
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn usage(usd: Option<f64>) -> Row {
        Row::Usage {
            at: "2026-01-02T03:04:05Z".into(),
            session_id: "s1".into(),
            request_id: Some("r1".into()),
            provider: "offline".into(),
            model: "offline".into(),
            input_tokens: 10,
            output_tokens: 20,
            usd,
        }
    }

    #[test]
    fn rows_round_trip_in_the_documented_shape_and_the_file_is_private() {
        let home = tempfile::tempdir().unwrap();
        let dir = dir(home.path());
        let day = date(2026, 1, 2);
        let alert = Row::BudgetAlert {
            at: "2026-01-02T03:04:05Z".into(),
            level: Level::Eighty,
            day_usd: 8.5,
            max_day_usd: 10.0,
        };
        append(&dir, day, &[usage(None), alert.clone()]).unwrap();
        append(&dir, day, &[usage(Some(0.25))]).unwrap();
        let text = std::fs::read_to_string(day_file(&dir, day)).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["kind"], "usage");
        assert_eq!(first["usd"], serde_json::Value::Null, "no price: usd is null");
        let second: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
        assert_eq!(second["kind"], "budget_alert");
        assert_eq!(second["level"], 80);
        assert_eq!(
            read_day(&dir, day).unwrap(),
            vec![usage(None), alert, usage(Some(0.25))]
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(day_file(&dir, day))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            read_day(&dir, date(2026, 1, 3)).unwrap().is_empty(),
            "no file: no rows"
        );
    }

    #[test]
    fn a_torn_line_is_skipped_and_an_oversized_day_is_an_error_not_a_cut() {
        let home = tempfile::tempdir().unwrap();
        let dir = dir(home.path());
        let day = date(2026, 1, 2);
        append(&dir, day, &[usage(Some(1.0))]).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(day_file(&dir, day))
            .unwrap()
            .write_all(b"{\"kind\":\"usa")
            .unwrap();
        assert_eq!(read_day(&dir, day).unwrap(), vec![usage(Some(1.0))]);
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(day_file(&dir, day))
            .unwrap();
        f.set_len(MAX_DAY_FILE + 1).unwrap();
        let e = read_day(&dir, day).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("64 MiB"), "{e}");
    }

    #[test]
    fn days_older_than_400_are_pruned_and_other_files_stay() {
        let home = tempfile::tempdir().unwrap();
        let dir = dir(home.path());
        let today = date(2026, 12, 4);
        let old = today.checked_sub(jiff::Span::new().days(401)).unwrap();
        let kept = today.checked_sub(jiff::Span::new().days(400)).unwrap();
        for d in [old, kept, today] {
            append(&dir, d, &[usage(None)]).unwrap();
        }
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        assert_eq!(prune(&dir, today), 1);
        assert!(!day_file(&dir, old).exists());
        assert!(day_file(&dir, kept).exists() && day_file(&dir, today).exists());
        assert!(dir.join("notes.txt").exists());
    }
}
