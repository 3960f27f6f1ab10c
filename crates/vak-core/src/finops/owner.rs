//! The cost ledger's one writer: `Finops`, the handle every session's runtime holds, and the owner task behind it that prices each model call, appends rows, keeps the day's spend and raises budget alerts.
//!
//! Callers send rows on a bounded queue (a full one makes the agent loop
//! wait a moment, never drops a row); the task takes what is queued as one
//! batch, folds it into the day, appends it on a blocking thread and only
//! then publishes the new spend and hands any budget alert to the sessions.

use super::budget::{self, Today};
use super::config::FileFinops;
use super::digest::{self, DigestView};
use super::ledger::{self, Level, Row};
use crate::background::{BackgroundReason, BackgroundResult, BackgroundSink, BackgroundSource};
use crate::error::{Error, Result};
use crate::provider::TokenUsage;
use crate::route::Route;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use tokio::sync::{mpsc, oneshot};

/// Rows waiting for the owner beyond which senders wait.
const QUEUE: usize = 1024;
/// The most messages one batch (one append) takes.
const BATCH: usize = 256;

/// What time it is: the system clock, or a test's.
pub(crate) type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

enum Msg {
    Usage {
        session_id: String,
        request_id: Option<String>,
        provider: String,
        model: String,
        usage: TokenUsage,
    },
    Fire {
        task_id: String,
        outcome: String,
    },
    /// Checks the budget without a row (after a task fire the caller recorded elsewhere).
    Check,
    /// Answered once everything sent before it is on disk.
    Flush(oneshot::Sender<()>),
}

/// The day's spend as readers see it, without asking the owner.
#[derive(Clone, Copy)]
struct Spend {
    date: Date,
    usd: f64,
}

/// What the handle and the owner share.
struct Shared {
    cfg: FileFinops,
    tz: TimeZone,
    dir: PathBuf,
    clock: Clock,
    /// Updated by the owner after each append; read by `today_usd`.
    spend: Mutex<Spend>,
    /// Where budget alerts go (the hub, set once it exists).
    sink: RwLock<Option<Weak<dyn BackgroundSink>>>,
}

impl Shared {
    fn today(&self) -> Date {
        (self.clock)().to_zoned(self.tz.clone()).date()
    }
}

/// Prices, the cost ledger and the daily budget of one server.
pub struct Finops {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    /// The owner's queue and day until the first record starts its task
    /// (a hub may be built outside the runtime). Taken once.
    idle: Mutex<Option<(mpsc::Receiver<Msg>, Today)>>,
}

impl Finops {
    /// Reads today's file (the spend goes on, alerts made stay made) and
    /// prunes days older than 400; the owner task starts with the first
    /// record. Blocking (startup).
    pub fn open(home: &std::path::Path, cfg: FileFinops, tz: TimeZone) -> Finops {
        Self::with_clock(home, cfg, tz, Arc::new(Timestamp::now))
    }

    pub(crate) fn with_clock(home: &std::path::Path, cfg: FileFinops, tz: TimeZone, clock: Clock) -> Finops {
        let dir = ledger::dir(home);
        let date = clock().to_zoned(tz.clone()).date();
        let removed = ledger::prune(&dir, date);
        if removed > 0 {
            tracing::info!(
                removed,
                "pruned cost ledger days older than {} days",
                ledger::KEEP_DAYS
            );
        }
        let today = load(&dir, date);
        let shared = Arc::new(Shared {
            spend: Mutex::new(Spend { date, usd: today.usd }),
            cfg,
            tz,
            dir,
            clock,
            sink: RwLock::new(None),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        Finops {
            tx,
            shared,
            idle: Mutex::new(Some((rx, today))),
        }
    }

    /// Where budget alerts are delivered from now on (the hub's sessions).
    pub fn set_sink(&self, sink: Weak<dyn BackgroundSink>) {
        *self.shared.sink.write().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// Records one model call of `route` (priced when `[finops.prices]`
    /// has the model) for the session and the run that made it. Waits only
    /// when the owner's queue is full.
    pub async fn record_usage(
        &self,
        session_id: &str,
        request_id: Option<&str>,
        route: &Route,
        usage: TokenUsage,
    ) {
        self.send(Msg::Usage {
            session_id: session_id.to_owned(),
            request_id: request_id.map(str::to_owned),
            provider: route.provider.name().to_owned(),
            model: route.model.clone(),
            usage,
        })
        .await
    }

    /// Records a scheduled task's fire (counted by the digest) and checks the budget.
    pub async fn record_fire(&self, task_id: &str, outcome: &str) {
        self.send(Msg::Fire {
            task_id: task_id.to_owned(),
            outcome: outcome.to_owned(),
        })
        .await
    }

    /// `record_fire` for a caller that cannot wait (the scheduler's
    /// firer): queued now, or, when the queue is full, by a task of its own.
    pub fn record_fire_nowait(&self, task_id: &str, outcome: &str) {
        let msg = Msg::Fire {
            task_id: task_id.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.start();
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(msg)) => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    if tx.send(msg).await.is_err() {
                        tracing::warn!("the cost ledger's owner has stopped: a task fire is not recorded");
                    }
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::warn!("the cost ledger's owner has stopped: a task fire is not recorded")
            }
        }
    }

    /// Checks the day's spend against the budget (alerts a level crossed).
    pub async fn check(&self) {
        self.send(Msg::Check).await
    }

    /// Resolves once everything recorded before is in the ledger.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Flush(tx)).await;
        let _ = rx.await;
    }

    /// Starts the owner task on the first record.
    fn start(&self) {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((rx, today)) = idle {
            tokio::spawn(run(self.shared.clone(), today, rx));
        }
    }

    async fn send(&self, msg: Msg) {
        self.start();
        if self.tx.send(msg).await.is_err() {
            tracing::warn!("the cost ledger's owner has stopped: a record is lost");
        }
    }

    /// Today's spend (server-local day) in US dollars.
    pub fn today_usd(&self) -> f64 {
        let spend = *self.shared.spend.lock().unwrap_or_else(|p| p.into_inner());
        if spend.date == self.shared.today() {
            spend.usd
        } else {
            0.0
        }
    }

    /// `[finops] max_day_usd`.
    pub fn max_day_usd(&self) -> Option<f64> {
        self.shared.cfg.max_day_usd
    }

    /// Whether task fires are refused: `stop_at_limit` and today's spend at
    /// or past `max_day_usd` (interactive runs are never refused).
    pub fn over_limit(&self) -> bool {
        let cfg = &self.shared.cfg;
        cfg.stop_at_limit
            && cfg
                .max_day_usd
                .is_some_and(|max| budget::reached(self.today_usd(), max, 100))
    }

    /// Why a task fire is refused now (`over_limit`), in words for its
    /// `last_fire`; None when fires go ahead.
    pub fn refusal(&self) -> Option<String> {
        if !self.over_limit() {
            return None;
        }
        Some(format!(
            "today's model spend, {}, has reached the daily budget of {} ([finops] max_day_usd); with stop_at_limit, tasks fire again tomorrow",
            budget::dollars(self.today_usd()),
            budget::dollars(self.max_day_usd().unwrap_or_default())
        ))
    }

    /// The zone days are counted in.
    pub fn timezone(&self) -> &TimeZone {
        &self.shared.tz
    }

    /// The last `days` days (1 to 90) of the ledger, with `memory_created`
    /// (the memory notes' creation times) counted in the window. Reads
    /// after what was recorded before, off the runtime.
    pub async fn digest(&self, days: u32, memory_created: Vec<String>) -> Result<DigestView> {
        digest::check_days(days)?;
        self.flush().await;
        let shared = self.shared.clone();
        let today = shared.today();
        let mut view = tokio::task::spawn_blocking(move || {
            digest::fold(&shared.dir, &shared.tz, today, days, &memory_created)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        view.max_day_usd = self.max_day_usd();
        view.today_usd = self.today_usd();
        view.timezone = crate::zone::name(&self.shared.tz);
        Ok(view)
    }
}

/// A day as its file says; an unreadable file is logged and read as empty.
fn load(dir: &std::path::Path, date: Date) -> Today {
    match ledger::read_day(dir, date) {
        Ok(rows) => Today::from_rows(date, &rows),
        Err(e) => {
            tracing::error!("{e}: today's spend starts from zero");
            Today::new(date)
        }
    }
}

/// A level crossed, on its way to the sessions that spent.
struct Alert {
    date: Date,
    level: Level,
    usd: f64,
    max: f64,
    sessions: Vec<String>,
}

/// The owner task: until every handle is gone.
async fn run(shared: Arc<Shared>, mut today: Today, mut rx: mpsc::Receiver<Msg>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut rows = Vec::new();
        let mut alerts = Vec::new();
        let mut flushed = Vec::new();
        for msg in batch.drain(..) {
            let now = (shared.clock)();
            let date = now.to_zoned(shared.tz.clone()).date();
            if date != today.date {
                // A new day (or the clock moved): what is pending belongs
                // to the old one's file; the new one starts from its own.
                write(&shared, today.date, std::mem::take(&mut rows)).await;
                let dir = shared.dir.clone();
                today = tokio::task::spawn_blocking(move || load(&dir, date))
                    .await
                    .unwrap_or_else(|_| Today::new(date));
            }
            // RFC 3339 in UTC, to the second, like the rest of the home's records.
            let at = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            match msg {
                Msg::Usage {
                    session_id,
                    request_id,
                    provider,
                    model,
                    usage,
                } => {
                    let usd = shared.cfg.cost(&provider, &model, &usage);
                    let row = Row::Usage {
                        at: at.clone(),
                        session_id,
                        request_id,
                        provider,
                        model,
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                        usd,
                    };
                    today.fold(&row);
                    rows.push(row);
                }
                Msg::Fire { task_id, outcome } => rows.push(Row::Fire {
                    at: at.clone(),
                    task_id,
                    outcome,
                }),
                Msg::Check => {}
                Msg::Flush(tx) => {
                    flushed.push(tx);
                    continue;
                }
            }
            for level in today.cross(shared.cfg.max_day_usd) {
                let max = shared.cfg.max_day_usd.unwrap_or_default();
                rows.push(Row::BudgetAlert {
                    at: at.clone(),
                    level,
                    day_usd: today.usd,
                    max_day_usd: max,
                });
                alerts.push(Alert {
                    date: today.date,
                    level,
                    usd: today.usd,
                    max,
                    sessions: today.spenders.iter().cloned().collect(),
                });
            }
        }
        write(&shared, today.date, rows).await;
        *shared.spend.lock().unwrap_or_else(|p| p.into_inner()) = Spend {
            date: today.date,
            usd: today.usd,
        };
        for tx in flushed {
            let _ = tx.send(());
        }
        if !alerts.is_empty() {
            deliver(&shared, alerts);
        }
    }
}

/// Appends `rows` to `date`'s file off the runtime; a failure is logged
/// (the spend in memory goes on: a budget keeps working on a full disk).
async fn write(shared: &Arc<Shared>, date: Date, rows: Vec<Row>) {
    if rows.is_empty() {
        return;
    }
    let dir = shared.dir.clone();
    let n = rows.len();
    match tokio::task::spawn_blocking(move || ledger::append(&dir, date, &rows)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(rows = n, "cannot append to the cost ledger of {date}: {e}"),
        Err(e) => tracing::error!(rows = n, "the cost ledger's append did not finish: {e}"),
    }
}

/// Hands each alert, in order, to every session that spent that day (on
/// a task of its own: the owner does not wait for sessions).
fn deliver(shared: &Arc<Shared>, alerts: Vec<Alert>) {
    let sink = shared
        .sink
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(Weak::upgrade);
    let Some(sink) = sink else {
        for a in &alerts {
            tracing::warn!(
                level = a.level.percent(),
                "a budget alert was recorded but has no sessions to go to yet"
            );
        }
        return;
    };
    let stop = shared.cfg.stop_at_limit;
    tokio::spawn(async move {
        for a in alerts {
            let text = budget::alert_text(a.date, a.level, a.usd, a.max, stop);
            let reason = match a.level {
                Level::Eighty => BackgroundReason::Budget80,
                Level::Hundred => BackgroundReason::Budget100,
            };
            tracing::info!(level = a.level.percent(), sessions = a.sessions.len(), "{text}");
            for session in &a.sessions {
                let result = BackgroundResult::new(
                    BackgroundSource::Budget,
                    format!("budget:{}:{}", a.date, a.level.percent()),
                    text.clone(),
                    Some(reason),
                );
                if let Err(e) = sink.deliver(session, result).await {
                    tracing::warn!(session = %session, "a budget alert was not delivered: {}", e.message);
                }
            }
        }
    });
}
