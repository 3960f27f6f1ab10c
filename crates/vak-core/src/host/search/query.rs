//! One transcript search, bounded: the words of a query (how many, how short a prefix, how many indexed words a prefix may stand for), the SQLite statements under a deadline and a stop flag, and the snippet cut from `highlight()`.

use super::{sql_error, Hit};
use crate::error::{Error, ErrorKind, Result};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest query, in bytes, and the most different words in it.
pub const MAX_QUERY: usize = 256;
pub const MAX_TERMS: usize = 8;
/// Characters a prefix word (`conf*`) needs before its `*`.
pub const MIN_PREFIX: usize = 3;
/// The most indexed words one prefix may stand for.
pub const MAX_EXPANSIONS: usize = 1000;
/// Words a snippet shows around its matches (as FTS5's `snippet(…, 16)` did).
const SNIPPET_WORDS: usize = 16;
/// SQLite virtual machine steps between two looks at the deadline.
const PROGRESS_STEPS: i32 = 1000;
/// What `highlight()` wraps a match in: private-use characters, so that
/// text with `**` in it is not mistaken for a match.
const OPEN: char = '\u{E000}';
const CLOSE: char = '\u{E001}';

/// One word of a query; `prefix` when typed with a trailing `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Term {
    word: String,
    prefix: bool,
}

/// The words of what a user typed, bounded: split as the tokenizer splits
/// (on anything but letters and digits), a trailing `*` kept as a prefix
/// match, repeats dropped (they add work, not meaning).
pub(crate) fn terms(q: &str) -> Result<Vec<Term>> {
    if q.len() > MAX_QUERY {
        return Err(Error::invalid(format!(
            "q is {} bytes; a query holds at most {MAX_QUERY}",
            q.len()
        )));
    }
    let mut terms: Vec<Term> = Vec::new();
    let mut seen: HashSet<(String, bool)> = HashSet::new();
    for raw in q.split_whitespace() {
        let prefix = raw.ends_with('*') && raw.trim_end_matches('*').ends_with(char::is_alphanumeric);
        let words: Vec<&str> = raw
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        let last = words.len().saturating_sub(1);
        for (i, word) in words.into_iter().enumerate() {
            let t = Term {
                word: word.to_string(),
                prefix: prefix && i == last,
            };
            if seen.insert((word.to_lowercase(), t.prefix)) {
                terms.push(t);
            }
        }
    }
    if terms.is_empty() {
        return Err(Error::invalid("q is required: one or more words to find"));
    }
    if terms.len() > MAX_TERMS {
        return Err(Error::invalid(format!(
            "q has {} different words; a query holds at most {MAX_TERMS}",
            terms.len()
        )));
    }
    for t in terms.iter().filter(|t| t.prefix) {
        // The index folds case and accents; only ASCII is folded here
        // exactly as it does, which the expansion count needs.
        if !t.word.is_ascii() {
            return Err(Error::invalid(format!(
                "{}*: a prefix takes ASCII letters and digits only; search for the whole word",
                t.word
            )));
        }
        if t.word.len() < MIN_PREFIX {
            return Err(Error::invalid(format!(
                "{}*: a prefix needs at least {MIN_PREFIX} characters before its *",
                t.word
            )));
        }
    }
    Ok(terms)
}

/// The FTS5 query for `terms`: each word quoted (so no word is read as FTS5
/// syntax), all of them required.
fn fts_match(terms: &[Term]) -> String {
    terms
        .iter()
        .map(|t| format!("\"{}\"{}", t.word, if t.prefix { "*" } else { "" }))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The FTS5 query for what a user typed (see `terms`).
pub fn fts_query(q: &str) -> Result<String> {
    terms(q).map(|t| fts_match(&t))
}

/// When a query must stop: its deadline, or its caller gone.
pub(super) struct Budget {
    pub(super) deadline: Instant,
    pub(super) limit: Duration,
    pub(super) stop: Arc<AtomicBool>,
}

impl Budget {
    fn over(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    /// Why the query stopped.
    fn error(&self) -> Error {
        if self.stop.load(Ordering::Relaxed) {
            // Nobody waits for this answer any more.
            return Error::new(ErrorKind::Unavailable, "the search was cancelled");
        }
        Error::new(
            ErrorKind::DeadlineExceeded,
            format!(
                "the search ran past its deadline of {:?} and was stopped; search for fewer or rarer words, or longer prefixes",
                self.limit
            ),
        )
    }

    /// A SQLite error, or the budget's own when it interrupted the statement.
    fn sql(&self, e: rusqlite::Error) -> Error {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted) {
            return self.error();
        }
        sql_error(e)
    }
}

/// Sets the stop flag when the query's future is dropped (its client went away).
pub(super) struct StopOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub(super) fn run(
    db: &Path,
    terms: &[Term],
    limit: usize,
    workspace: Option<&str>,
    budget: &Budget,
) -> Result<Vec<Hit>> {
    // Read-write without create: a read-only connection cannot recover a
    // WAL the writer left behind; this one only ever runs a SELECT (and
    // makes a temporary fts5vocab table).
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_error)?;
    conn.busy_timeout(std::time::Duration::from_secs(2))
        .map_err(sql_error)?;
    let (deadline, stop) = (budget.deadline, budget.stop.clone());
    conn.progress_handler(
        PROGRESS_STEPS,
        Some(move || stop.load(Ordering::Relaxed) || Instant::now() >= deadline),
    );
    // A query that waited past its deadline for a thread does not start.
    if budget.over() {
        return Err(budget.error());
    }
    check_expansions(&conn, terms, budget)?;
    let fts = fts_match(terms);
    let mut hits: Vec<(i64, Hit)> = {
        let mut stmt = conn
            .prepare(
                "SELECT m.id, m.session_id, m.seq, s.workspace, m.role, bm25(msgs_fts)
                 FROM msgs_fts
                 JOIN msgs m ON m.id = msgs_fts.rowid
                 JOIN sessions s ON s.session_id = m.session_id
                 WHERE msgs_fts MATCH ?1 AND (?2 IS NULL OR s.workspace = ?2)
                 ORDER BY bm25(msgs_fts)
                 LIMIT ?3",
            )
            .map_err(|e| budget.sql(e))?;
        let rows = stmt
            .query_map(params![fts, workspace, limit as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    Hit {
                        session_id: r.get(1)?,
                        seq: r.get::<_, i64>(2)? as u64,
                        workspace: r.get(3)?,
                        role: r.get(4)?,
                        snippet: String::new(),
                        score: -r.get::<_, f64>(5)?,
                    },
                ))
            })
            .map_err(|e| budget.sql(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| budget.sql(e))?
    };
    let mut highlight = conn
        .prepare("SELECT highlight(msgs_fts, 0, ?3, ?4) FROM msgs_fts WHERE msgs_fts MATCH ?1 AND rowid = ?2")
        .map_err(|e| budget.sql(e))?;
    for (id, hit) in &mut hits {
        // One message's highlight is one SQLite step: look between them.
        if budget.over() {
            return Err(budget.error());
        }
        let marked: Option<String> = highlight
            .query_row(params![fts, *id, OPEN.to_string(), CLOSE.to_string()], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| budget.sql(e))?;
        hit.snippet = snippet(&marked.unwrap_or_default(), SNIPPET_WORDS);
    }
    Ok(hits.into_iter().map(|(_, h)| h).collect())
}

/// Refuses a prefix that stands for more than `MAX_EXPANSIONS` indexed
/// words (each is a list FTS5 merges before the first hit, in one step).
fn check_expansions(conn: &Connection, terms: &[Term], budget: &Budget) -> Result<()> {
    if !terms.iter().any(|t| t.prefix) {
        return Ok(());
    }
    conn.execute_batch("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, msgs_fts, row)")
        .map_err(|e| budget.sql(e))?;
    for t in terms.iter().filter(|t| t.prefix) {
        // ASCII (see `terms`): the index's folding is lowercasing, and the
        // words with this prefix sort from it to the prefix with its last
        // character raised by one.
        let low = t.word.to_ascii_lowercase();
        let mut high = low.clone().into_bytes();
        if let Some(last) = high.last_mut() {
            *last += 1;
        }
        let high = String::from_utf8(high).map_err(|e| Error::internal(e.to_string()))?;
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM (SELECT 1 FROM temp.vocab WHERE term >= ?1 AND term < ?2 LIMIT ?3)",
                params![low, high, MAX_EXPANSIONS as i64 + 1],
                |r| r.get(0),
            )
            .map_err(|e| budget.sql(e))?;
        if n as usize > MAX_EXPANSIONS {
            return Err(Error::invalid(format!(
                "{}*: the prefix matches more than {MAX_EXPANSIONS} indexed words; type more of it",
                t.word
            )));
        }
    }
    Ok(())
}

/// At most `words` words of `marked` (text whose matches `highlight()`
/// wrapped in OPEN and CLOSE) around the most matches, the matched words in
/// `**`, `…` where text was cut: the window FTS5's `snippet()` picks (the
/// most matches, centred on them), found in one pass.
fn snippet(marked: &str, words: usize) -> String {
    // The text without the marks, and its words: (start, end, matched).
    let mut text = String::with_capacity(marked.len());
    let mut spans: Vec<(usize, usize, bool)> = Vec::new();
    let (mut inside, mut word_start) = (false, None::<(usize, bool)>);
    for c in marked.chars() {
        match c {
            OPEN => inside = true,
            CLOSE => inside = false,
            c if c.is_alphanumeric() => {
                match &mut word_start {
                    Some((_, hit)) => *hit |= inside,
                    None => word_start = Some((text.len(), inside)),
                }
                text.push(c);
            }
            c => {
                if let Some((start, hit)) = word_start.take() {
                    spans.push((start, text.len(), hit));
                }
                text.push(c);
            }
        }
    }
    if let Some((start, hit)) = word_start {
        spans.push((start, text.len(), hit));
    }
    if spans.is_empty() || words == 0 {
        return text;
    }
    // The window of `words` words starting at a match with the most matches.
    let hits: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].2).collect();
    let (mut best, mut best_count, mut best_last) = (0, 0, 0);
    let mut end = 0;
    for (k, &first) in hits.iter().enumerate() {
        while end < hits.len() && hits[end] < first + words {
            end += 1;
        }
        if end - k > best_count {
            (best, best_count, best_last) = (first, end - k, hits[end - 1]);
        }
    }
    // Centred on its matches, within the text.
    let start = if best_count == 0 {
        0
    } else {
        best.saturating_sub((words - (best_last - best + 1)) / 2)
    };
    let start = start.min(spans.len().saturating_sub(words));
    let stop = (start + words).min(spans.len());
    let mut out = String::new();
    let from = if start == 0 {
        0
    } else {
        out.push('…');
        spans[start].0
    };
    let to = if stop == spans.len() {
        text.len()
    } else {
        spans[stop - 1].1
    };
    let mut at = from;
    for &(s, e, hit) in &spans[start..stop] {
        out.push_str(&text[at..s]);
        if hit {
            out.push_str("**");
            out.push_str(&text[s..e]);
            out.push_str("**");
        } else {
            out.push_str(&text[s..e]);
        }
        at = e;
    }
    out.push_str(&text[at..to]);
    if stop < spans.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_quote_every_word_and_are_bounded() {
        assert_eq!(fts_query("hello world").unwrap(), "\"hello\" AND \"world\"");
        assert_eq!(
            fts_query("a\"b OR -c NEAR(d)").unwrap(),
            "\"a\" AND \"b\" AND \"OR\" AND \"c\" AND \"NEAR\" AND \"d\""
        );
        assert_eq!(fts_query("pref*").unwrap(), "\"pref\"*");
        // Repeats add work, not meaning; a prefix and the whole word differ.
        assert_eq!(
            fts_query("Word word WORD word* Word* x-word*").unwrap(),
            "\"Word\" AND \"word\"* AND \"x\""
        );
        assert!(fts_query(" *** ").is_err());
        let nine: Vec<String> = (0..9).map(|i| format!("w{i}")).collect();
        let e = fts_query(&nine.join(" ")).unwrap_err();
        assert!(
            e.message.contains("9 different words; a query holds at most 8"),
            "{e:?}"
        );
        assert!(fts_query(&nine[..8].join(" ")).is_ok());
        assert!(fts_query(&"a ".repeat(100)).is_ok(), "one word, repeated");
        assert!(fts_query(&"a".repeat(MAX_QUERY + 1)).is_err());
        for (q, needle) in [
            ("ab*", "ab*: a prefix needs at least 3 characters before its *"),
            ("x a*", "a*: a prefix needs at least 3"),
            (
                "caf\u{e9}*",
                "caf\u{e9}*: a prefix takes ASCII letters and digits only",
            ),
        ] {
            let e = fts_query(q).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(needle), "{q}: {}", e.message);
        }
        assert!(fts_query("abc*").is_ok());
    }

    #[test]
    fn a_snippet_shows_sixteen_words_around_the_most_matches() {
        let m = |s: &str| s.replace('[', &OPEN.to_string()).replace(']', &CLOSE.to_string());
        // Short: the whole text, every match marked.
        assert_eq!(
            snippet(&m("the [quokka] smiles, at [dawn]."), 16),
            "the **quokka** smiles, at **dawn**."
        );
        // Long: the window with the most matches, centred on them, cut with ….
        let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        let mut text = words.clone();
        text[50] = "[hit]".into();
        text[52] = "[hit]".into();
        text[5] = "[hit]".into();
        let s = snippet(&m(&text.join(" ")), 16);
        assert_eq!(
            s,
            "…w44 w45 w46 w47 w48 w49 **hit** w51 **hit** w53 w54 w55 w56 w57 w58 w59…"
        );
        // Near an end: the window stays within the text.
        let mut text = words.clone();
        text[98] = "[hit]".into();
        let s = snippet(&m(&text.join(" ")), 16);
        assert!(s.starts_with("…w84 ") && s.ends_with("**hit** w99"), "{s}");
        let mut text = words;
        text[0] = "[hit]".into();
        let s = snippet(&m(&text.join(" ")), 16);
        assert!(s.starts_with("**hit** w1 ") && s.ends_with(" w15…"), "{s}");
        // A message of one repeated word is cut in one pass.
        let long = m(&vec!["[foo]"; 20_000].join(" "));
        assert_eq!(snippet(&long, 16), format!("{}…", vec!["**foo**"; 16].join(" ")));
    }
}
