//! The scheduler on tokio's paused time: a `TokioClock`, an in-memory store and a firer that reports each fire on a channel.

use std::sync::atomic::{AtomicI64, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use super::*;
use crate::automation::store::MemoryTasks;

/// Knows one session, "s1", and one model, "fake/m".
struct Known;

impl TaskCheck for Known {
    fn session_exists(&self, id: &str) -> bool {
        id == "s1"
    }
    fn model_known(&self, pin: &str) -> bool {
        pin == "fake/m"
    }
}

/// Sends each fire on a channel and answers `started` at once.
struct Recorder(UnboundedSender<(String, Fire)>);

impl Firer for Recorder {
    fn fire(&self, task: TaskDef, fire: Fire) -> BoxFuture<'static, LastFire> {
        let _ = self.0.send((task.id, fire.clone()));
        Box::pin(async move {
            LastFire {
                at: fire.at,
                outcome: TaskOutcome::Started,
                slot: fire.slot,
                session_id: None,
                message: String::new(),
            }
        })
    }
}

/// Sends each claim on a channel and answers `won`.
struct Claims {
    seen: UnboundedSender<(String, String)>,
    won: bool,
}

impl SlotClaim for Claims {
    fn claim(&self, task_id: &str, slot: &str) -> BoxFuture<'_, bool> {
        let _ = self.seen.send((task_id.to_owned(), slot.to_owned()));
        let won = self.won;
        Box::pin(async move { won })
    }
}

struct Rig {
    handle: SchedulerHandle,
    fires: UnboundedReceiver<(String, Fire)>,
    persist: Arc<MemoryTasks>,
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A scheduled slot's name.
fn slot(s: &str) -> String {
    ts(s).as_second().to_string()
}

fn config(
    persist: Arc<MemoryTasks>,
    clock: Arc<dyn Clock>,
    zone: &str,
    catch_up_missed: bool,
    firer: Arc<dyn Firer>,
    claim: Arc<dyn SlotClaim>,
) -> SchedulerConfig {
    SchedulerConfig {
        persist,
        clock,
        tz: TimeZone::get(zone).unwrap(),
        catch_up_missed,
        firer,
        claim,
        check: Arc::new(Known),
    }
}

fn start_with(persist: Arc<MemoryTasks>, clock: Arc<dyn Clock>, zone: &str, catch_up: bool) -> Rig {
    let (tx, fires) = unbounded_channel();
    let cfg = config(
        persist.clone(),
        clock,
        zone,
        catch_up,
        Arc::new(Recorder(tx)),
        Arc::new(LocalClaim),
    );
    Rig {
        handle: Scheduler::start(cfg).unwrap(),
        fires,
        persist,
    }
}

fn start(persist: Arc<MemoryTasks>, at: &str, zone: &str, catch_up: bool) -> Rig {
    start_with(persist, Arc::new(TokioClock::new(ts(at))), zone, catch_up)
}

fn script_task(name: &str, schedule: Option<&str>) -> NewTask {
    NewTask {
        name: name.into(),
        script: Some("date".into()),
        schedule: schedule.map(Into::into),
        workspace: "/tmp".into(),
        ..NewTask::default()
    }
}

/// A stored task, as an earlier run of the server left it.
fn stored(name: &str, schedule: &str, created: &str, last_slot: Option<&str>, enabled: bool) -> TaskDef {
    let mut def = NewTask {
        enabled: Some(enabled),
        ..script_task(name, Some(schedule))
    }
    .into_def(crate::automation::task::new_task_id(), ts(created))
    .unwrap();
    def.last_slot = last_slot.map(slot);
    def
}

/// The next fire, however far ahead on the paused clock.
async fn next_fire(rig: &mut Rig) -> (String, Fire) {
    tokio::time::timeout(Duration::from_secs(40 * 86_400), rig.fires.recv())
        .await
        .expect("a fire within 40 days")
        .expect("the firer is alive")
}

/// Yields until `done` holds, within 5 s of real time (yielding keeps the
/// paused clock where it is).
async fn until(mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "not reached within 5 s");
        tokio::task::yield_now().await;
    }
}

fn wall(fire: &Fire, zone: &str) -> String {
    let secs: i64 = fire.slot.parse().unwrap();
    Timestamp::from_second(secs)
        .unwrap()
        .to_zoned(TimeZone::get(zone).unwrap())
        .strftime("%Y-%m-%d %H:%M %Z")
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn an_every_minute_task_fires_at_each_minute_and_persists_the_slot_first() {
    let mut rig = start(Arc::default(), "2026-01-05T10:00:30Z", "UTC", false);
    let view = rig
        .handle
        .create(script_task("tick", Some("* * * * *")))
        .await
        .unwrap();
    let id = view.def.id.clone();
    assert_eq!(view.next_fire.unwrap().timestamp(), ts("2026-01-05T10:01:00Z"));
    for minute in ["10:01", "10:02", "10:03"] {
        let (task, fire) = next_fire(&mut rig).await;
        let expect = format!("2026-01-05T{minute}:00Z");
        assert_eq!(
            (task.as_str(), fire.slot.as_str()),
            (id.as_str(), slot(&expect).as_str())
        );
        assert!(!fire.manual);
        assert_eq!(fire.at, ts(&expect), "fired on time");
        // Persisted before the fire was spawned.
        let saved = rig.persist.snapshot();
        assert_eq!(saved[0].last_slot.as_deref(), Some(fire.slot.as_str()));
    }
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(
        fire.slot,
        slot("2026-01-05T10:04:00Z"),
        "no slot skipped or repeated"
    );
}

#[tokio::test(start_paused = true)]
async fn day_of_month_and_day_of_week_are_ored_through_the_scheduler() {
    let mut rig = start(Arc::default(), "2026-04-01T00:00:30Z", "UTC", false);
    rig.handle
        .create(script_task("fri-or-13th", Some("0 0 13 * FRI")))
        .await
        .unwrap();
    let mut days = Vec::new();
    for _ in 0..4 {
        let (_, fire) = next_fire(&mut rig).await;
        days.push(wall(&fire, "UTC"));
    }
    assert_eq!(
        days,
        [
            "2026-04-03 00:00 UTC",
            "2026-04-10 00:00 UTC",
            "2026-04-13 00:00 UTC",
            "2026-04-17 00:00 UTC"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_dst_gap_fires_once_after_it_and_an_overlap_fires_once() {
    let zone = "America/New_York";
    let mut rig = start(Arc::default(), "2026-03-07T12:00:00-05:00", zone, false);
    rig.handle
        .create(script_task("gap", Some("30 2 * * *")))
        .await
        .unwrap();
    let (_, first) = next_fire(&mut rig).await;
    let (_, second) = next_fire(&mut rig).await;
    // 02:30 does not exist on 8 March: it fires once, at 03:30 new time.
    assert_eq!(wall(&first, zone), "2026-03-08 03:30 EDT");
    assert_eq!(wall(&second, zone), "2026-03-09 02:30 EDT");

    let mut rig = start(Arc::default(), "2026-10-31T12:00:00-04:00", zone, false);
    let id = rig
        .handle
        .create(script_task("overlap", Some("30 1 * * *")))
        .await
        .unwrap()
        .def
        .id;
    let (_, first) = next_fire(&mut rig).await;
    assert_eq!(wall(&first, zone), "2026-11-01 01:30 EDT");
    // The repeated 01:30 (EST, an hour later) is not next: the next day's is.
    let next = rig.handle.get(&id).await.unwrap().next_fire.unwrap();
    assert_eq!(next.to_string(), "2026-11-02T01:30:00-05:00[America/New_York]");
    let (_, second) = next_fire(&mut rig).await;
    assert_eq!(wall(&second, zone), "2026-11-02 01:30 EST");
}

#[tokio::test(start_paused = true)]
async fn catch_up_fires_the_most_recent_missed_slot_once_and_without_it_none() {
    let tasks = || {
        vec![
            // Last fired at 08:00: 09:00 and 10:00 were missed; 10:00 is the most recent.
            stored(
                "hourly",
                "0 * * * *",
                "2026-01-01T00:00:00Z",
                Some("2026-01-05T08:00:00Z"),
                true,
            ),
            // Created after 10:00: nothing of its own was missed.
            stored("young", "0 * * * *", "2026-01-05T10:10:00Z", None, true),
            stored("off", "0 * * * *", "2026-01-01T00:00:00Z", None, false),
        ]
    };
    let persist = Arc::new(MemoryTasks::new(tasks()));
    let (hourly, young) = (persist.snapshot()[0].id.clone(), persist.snapshot()[1].id.clone());
    let mut rig = start(persist, "2026-01-05T10:30:00Z", "UTC", true);
    let (task, fire) = next_fire(&mut rig).await;
    assert_eq!(
        (task.as_str(), fire.slot.as_str()),
        (hourly.as_str(), slot("2026-01-05T10:00:00Z").as_str())
    );
    assert_eq!(fire.at, ts("2026-01-05T10:30:00Z"));
    assert!(!fire.manual);
    assert_eq!(
        rig.persist.snapshot()[0].last_slot,
        Some(slot("2026-01-05T10:00:00Z"))
    );
    // Then only the schedule: both enabled tasks at 11:00, the hourly one not again at 10:00.
    let mut at_eleven = [next_fire(&mut rig).await, next_fire(&mut rig).await];
    at_eleven.sort_by_key(|(t, _)| *t != hourly);
    let got: Vec<_> = at_eleven
        .iter()
        .map(|(t, f)| (t.clone(), f.slot.clone()))
        .collect();
    let eleven = slot("2026-01-05T11:00:00Z");
    assert_eq!(got, [(hourly.clone(), eleven.clone()), (young.clone(), eleven)]);

    let persist = Arc::new(MemoryTasks::new(tasks()));
    let mut rig = start(persist, "2026-01-05T10:30:00Z", "UTC", false);
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(
        fire.slot,
        slot("2026-01-05T11:00:00Z"),
        "no missed slot fires without catch-up"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restart_never_fires_the_last_slot_again() {
    let persist: Arc<MemoryTasks> = Arc::default();
    let mut rig = start(persist.clone(), "2026-01-05T10:00:30Z", "UTC", true);
    rig.handle
        .create(script_task("tick", Some("* * * * *")))
        .await
        .unwrap();
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(fire.slot, slot("2026-01-05T10:01:00Z"));
    rig.handle.stop().await;
    assert!(
        rig.handle.list().await.is_err(),
        "a stopped scheduler answers an error"
    );

    // Started again at the very instant of the slot it fired, and a little later: each time
    // with catch-up on, the slot already fired is not fired again.
    for at in ["2026-01-05T10:01:00Z", "2026-01-05T10:01:20Z"] {
        let mut again = start(persist.clone(), at, "UTC", true);
        let (_, fire) = next_fire(&mut again).await;
        assert_eq!(fire.slot, slot("2026-01-05T10:02:00Z"), "restarted at {at}");
        again.handle.stop().await;
        // Put the store back as the first run left it.
        let mut tasks = persist.snapshot();
        tasks[0].last_slot = Some(slot("2026-01-05T10:01:00Z"));
        persist.save(&tasks).unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn run_now_fires_at_once_and_plans_the_next_slot_from_now() {
    let mut rig = start(Arc::default(), "2026-01-05T10:30:00Z", "UTC", false);
    let id = rig
        .handle
        .create(script_task("hourly", Some("0 * * * *")))
        .await
        .unwrap()
        .def
        .id;
    let view = rig.handle.run_now(&id).await.unwrap();
    assert_eq!(view.next_fire.unwrap().timestamp(), ts("2026-01-05T11:00:00Z"));
    let (task, fire) = next_fire(&mut rig).await;
    assert_eq!(task, id);
    assert!(fire.manual);
    assert_eq!(fire.slot, format!("now-{}", fire.at.as_millisecond()));
    assert!(fire.at < ts("2026-01-05T11:00:00Z"));
    // Its outcome is recorded and persisted.
    until(async || {
        rig.handle
            .get(&id)
            .await
            .unwrap()
            .def
            .last_fire
            .is_some_and(|l| l.slot == fire.slot)
    })
    .await;
    let saved = rig.persist.snapshot();
    assert_eq!(saved[0].last_fire.as_ref().unwrap().outcome, TaskOutcome::Started);
    // The schedule goes on from 11:00.
    let (_, next) = next_fire(&mut rig).await;
    assert_eq!((next.slot, next.manual), (slot("2026-01-05T11:00:00Z"), false));

    // A disabled or unscheduled task runs now too, and has no next fire.
    let off = rig
        .handle
        .create(NewTask {
            enabled: Some(false),
            ..script_task("off", Some("0 * * * *"))
        })
        .await
        .unwrap()
        .def
        .id;
    assert!(rig.handle.run_now(&off).await.unwrap().next_fire.is_none());
    assert!(next_fire(&mut rig).await.1.manual);
    assert!(matches!(
        rig.handle.run_now("task_000000000000").await,
        Err(TaskError::NotFound)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_slot_claimed_elsewhere_does_not_fire() {
    let (tx, mut fires) = unbounded_channel();
    let (seen, mut claims) = unbounded_channel();
    let persist: Arc<MemoryTasks> = Arc::default();
    let cfg = config(
        persist.clone(),
        Arc::new(TokioClock::new(ts("2026-01-05T10:00:30Z"))),
        "UTC",
        false,
        Arc::new(Recorder(tx)),
        Arc::new(Claims { seen, won: false }),
    );
    let handle = Scheduler::start(cfg).unwrap();
    let id = handle
        .create(script_task("tick", Some("* * * * *")))
        .await
        .unwrap()
        .def
        .id;
    for minute in ["10:01", "10:02"] {
        let claim = tokio::time::timeout(Duration::from_secs(120), claims.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim, (id.clone(), slot(&format!("2026-01-05T{minute}:00Z"))));
    }
    assert!(fires.try_recv().is_err(), "an unclaimed slot fired");
    assert_eq!(persist.snapshot()[0].last_slot, None);
    // The schedule moved on all the same.
    let next = handle.get(&id).await.unwrap().next_fire.unwrap().timestamp();
    assert_eq!(next, ts("2026-01-05T10:03:00Z"));
}

#[tokio::test(start_paused = true)]
async fn invalid_tasks_are_refused_with_the_field_and_change_nothing() {
    let rig = start(Arc::default(), "2026-01-05T10:00:00Z", "UTC", false);
    let h = &rig.handle;
    let field = |r: Result<TaskView, TaskError>| match r {
        Err(TaskError::Invalid(e)) => e.field,
        other => panic!("not refused as invalid: {other:?}"),
    };
    assert_eq!(
        field(h.create(script_task("x", Some("0 25 * * *"))).await),
        "schedule"
    );
    let neither = NewTask {
        script: None,
        ..script_task("x", None)
    };
    assert_eq!(field(h.create(neither).await), "prompt");
    let both = NewTask {
        prompt: Some("p".into()),
        ..script_task("x", None)
    };
    assert_eq!(field(h.create(both).await), "prompt");
    let session = NewTask {
        session_id: Some("nope".into()),
        ..script_task("x", None)
    };
    assert_eq!(field(h.create(session).await), "session_id");
    let model = NewTask {
        model_pin: Some("nope/m".into()),
        ..script_task("x", None)
    };
    assert_eq!(field(h.create(model).await), "model_pin");
    assert!(h.list().await.unwrap().is_empty());
    assert!(rig.persist.snapshot().is_empty());

    let good = h
        .create(script_task("good", Some("0 * * * *")))
        .await
        .unwrap()
        .def;
    let bad_name = TaskPatch {
        name: Some(String::new()),
        ..TaskPatch::default()
    };
    assert_eq!(field(h.update(&good.id, bad_name).await), "name");
    let bad_cron = TaskPatch {
        schedule: Some(Some("every day".into())),
        ..TaskPatch::default()
    };
    assert_eq!(field(h.update(&good.id, bad_cron).await), "schedule");
    assert_eq!(h.get(&good.id).await.unwrap().def, good, "unchanged");
    assert!(matches!(
        h.update("task_000000000000", TaskPatch::default()).await,
        Err(TaskError::NotFound)
    ));
    assert!(matches!(
        h.delete("task_000000000000").await,
        Err(TaskError::NotFound)
    ));
    assert!(matches!(
        h.get("task_000000000000").await,
        Err(TaskError::NotFound)
    ));

    // A good change is planned from its new schedule; disabling drops the next fire.
    let hourly = TaskPatch {
        schedule: Some(Some("30 * * * *".into())),
        ..TaskPatch::default()
    };
    let view = h.update(&good.id, hourly).await.unwrap();
    assert_eq!(view.next_fire.unwrap().timestamp(), ts("2026-01-05T10:30:00Z"));
    let off = TaskPatch {
        enabled: Some(false),
        ..TaskPatch::default()
    };
    assert!(h.update(&good.id, off).await.unwrap().next_fire.is_none());
    assert!(h.next_fires(10).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_store_bounds_and_failures_are_answered_and_roll_back() {
    let rig = start(Arc::default(), "2026-01-05T10:00:00Z", "UTC", false);
    let h = &rig.handle;
    let first = h.create(script_task("first", None)).await.unwrap().def.id;
    rig.persist.fail_saves(true);
    assert!(matches!(
        h.create(script_task("lost", None)).await,
        Err(TaskError::Store(_))
    ));
    assert!(matches!(h.delete(&first).await, Err(TaskError::Store(_))));
    let rename = TaskPatch {
        name: Some("renamed".into()),
        ..TaskPatch::default()
    };
    assert!(matches!(h.update(&first, rename).await, Err(TaskError::Store(_))));
    let names: Vec<_> = h.list().await.unwrap().into_iter().map(|v| v.def.name).collect();
    assert_eq!(names, ["first"], "nothing changed that the store did not keep");
    rig.persist.fail_saves(false);

    for i in 1..crate::automation::store::MAX_TASKS {
        h.create(script_task(&format!("t{i}"), None)).await.unwrap();
    }
    assert!(matches!(
        h.create(script_task("one more", None)).await,
        Err(TaskError::Full)
    ));
    h.delete(&first).await.unwrap();
    h.create(script_task("one more", None)).await.unwrap();
}

/// Fires that wait for a gate before answering.
struct Gated {
    fired: UnboundedSender<(String, oneshot::Sender<()>)>,
}

impl Firer for Gated {
    fn fire(&self, task: TaskDef, fire: Fire) -> BoxFuture<'static, LastFire> {
        let (open, gate) = oneshot::channel();
        let _ = self.fired.send((task.id, open));
        Box::pin(async move {
            let _ = gate.await;
            LastFire {
                at: fire.at,
                outcome: TaskOutcome::Delivered,
                slot: fire.slot,
                session_id: None,
                message: String::new(),
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_fire_in_flight_when_its_task_is_deleted_finishes_and_its_result_is_dropped() {
    let (fired, mut gates) = unbounded_channel();
    let persist: Arc<MemoryTasks> = Arc::default();
    let cfg = config(
        persist.clone(),
        Arc::new(TokioClock::new(ts("2026-01-05T10:00:00Z"))),
        "UTC",
        false,
        Arc::new(Gated { fired }),
        Arc::new(LocalClaim),
    );
    let h = Scheduler::start(cfg).unwrap();
    let doomed = h.create(script_task("doomed", None)).await.unwrap().def.id;
    let kept = h.create(script_task("kept", None)).await.unwrap().def.id;
    h.run_now(&doomed).await.unwrap();
    let (_, open_doomed) = gates.recv().await.unwrap();
    h.delete(&doomed).await.unwrap();
    open_doomed.send(()).unwrap();
    // The kept task's result is queued after the doomed one's: once it is
    // recorded, the doomed one has been handled (and dropped).
    h.run_now(&kept).await.unwrap();
    let (_, open_kept) = gates.recv().await.unwrap();
    open_kept.send(()).unwrap();
    until(async || h.get(&kept).await.unwrap().def.last_fire.is_some()).await;
    let ids: Vec<_> = persist.snapshot().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, [kept.as_str()]);
    assert!(matches!(h.get(&doomed).await, Err(TaskError::NotFound)));
}

/// A tokio clock that can be set forward, as a wall clock jumps.
struct JumpClock {
    inner: TokioClock,
    jumped_secs: AtomicI64,
}

impl Clock for JumpClock {
    fn now(&self) -> Timestamp {
        let jump = SignedDuration::from_secs(self.jumped_secs.load(Ordering::SeqCst));
        self.inner.now() + jump
    }
}

#[tokio::test(start_paused = true)]
async fn a_wall_clock_jump_is_noticed_within_a_minute_and_fires_the_latest_slot_once() {
    let clock = Arc::new(JumpClock {
        inner: TokioClock::new(ts("2026-01-05T10:30:00Z")),
        jumped_secs: AtomicI64::new(0),
    });
    let mut rig = start_with(Arc::default(), clock.clone(), "UTC", false);
    let id = rig
        .handle
        .create(script_task("hourly", Some("0 * * * *")))
        .await
        .unwrap()
        .def
        .id;
    // Two hours pass at once (a suspended laptop wakes): 11:00 and 12:00 are behind.
    clock.jumped_secs.store(2 * 3600, Ordering::SeqCst);
    let jumped_at = clock.now();
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(
        fire.slot,
        slot("2026-01-05T12:00:00Z"),
        "the latest slot, not the oldest"
    );
    assert!(
        fire.at.duration_since(jumped_at) <= SignedDuration::from_secs(60),
        "{}",
        fire.at
    );
    let next = rig.handle.next_fires(5).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].def.id, id);
    assert_eq!(
        next[0].next_fire.as_ref().unwrap().timestamp(),
        ts("2026-01-05T13:00:00Z")
    );
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(fire.slot, slot("2026-01-05T13:00:00Z"));
}

#[tokio::test(start_paused = true)]
async fn reload_takes_the_store_s_tasks_and_the_later_last_slot() {
    let persist = Arc::new(MemoryTasks::new(vec![stored(
        "hourly",
        "0 * * * *",
        "2026-01-01T00:00:00Z",
        None,
        true,
    )]));
    let mut rig = start(persist.clone(), "2026-01-05T10:30:00Z", "UTC", false);
    let id = persist.snapshot()[0].id.clone();
    // Another replica fired 11:00 and 12:00 and wrote the store; and added a task.
    let mut written = persist.snapshot();
    written[0].last_slot = Some(slot("2026-01-05T12:00:00Z"));
    written.push(stored("other", "15 * * * *", "2026-01-05T10:00:00Z", None, true));
    persist.save(&written).unwrap();
    rig.handle.reload().await.unwrap();
    let views = rig.handle.list().await.unwrap();
    assert_eq!(views.len(), 2);
    assert_eq!(
        views[0].next_fire.as_ref().unwrap().timestamp(),
        ts("2026-01-05T13:00:00Z")
    );
    assert_eq!(
        views[1].next_fire.as_ref().unwrap().timestamp(),
        ts("2026-01-05T11:15:00Z")
    );
    let (task, fire) = next_fire(&mut rig).await;
    assert_eq!(
        (task.as_str() != id, fire.slot),
        (true, slot("2026-01-05T11:15:00Z"))
    );
    assert_eq!(rig.handle.timezone().await, TimeZone::UTC);
}

#[tokio::test(start_paused = true)]
async fn tasks_in_the_home_survive_a_restart_and_a_bad_stored_schedule_only_stops_that_task() {
    use crate::automation::store::FileTasks;
    let home = tempfile::tempdir().unwrap();
    let (tx, _fires) = unbounded_channel();
    let cfg = |tx: UnboundedSender<(String, Fire)>| SchedulerConfig {
        persist: Arc::new(FileTasks::new(home.path())),
        clock: Arc::new(TokioClock::new(ts("2026-01-05T10:00:00Z"))),
        tz: TimeZone::UTC,
        catch_up_missed: true,
        firer: Arc::new(Recorder(tx)),
        claim: Arc::new(LocalClaim),
        check: Arc::new(Known),
    };
    let h = Scheduler::start(cfg(tx.clone())).unwrap();
    let made = h.create(script_task("kept", Some("0 * * * *"))).await.unwrap();
    h.stop().await;

    // Someone edits the file by hand: one schedule no longer parses.
    let store = FileTasks::new(home.path());
    let mut tasks = store.load().unwrap();
    assert_eq!(tasks, std::slice::from_ref(&made.def));
    let mut broken = tasks[0].clone();
    broken.id = "task_0123456789ab".into();
    broken.schedule = Some("0 * * *".into());
    tasks.push(broken);
    store.save(&tasks).unwrap();

    let h = Scheduler::start(cfg(tx)).unwrap();
    let views = h.list().await.unwrap();
    assert_eq!(views.len(), 2);
    assert_eq!(views[0].def, made.def);
    assert_eq!(
        views[0].next_fire.as_ref().unwrap().timestamp(),
        ts("2026-01-05T11:00:00Z")
    );
    assert_eq!(
        views[1].next_fire, None,
        "a stored schedule that does not parse never fires"
    );

    // A file that does not parse stops the start, naming the file.
    std::fs::write(store.path(), b"not json").unwrap();
    let (tx, _fires) = unbounded_channel();
    let Err(e) = Scheduler::start(cfg(tx)) else {
        panic!("started over a corrupt store");
    };
    assert!(e.message.contains("tasks.json"), "{}", e.message);
}

#[test]
fn task_errors_become_the_core_s_error_kinds() {
    use crate::ErrorKind;
    let kind = |e: TaskError| Error::from(e).kind;
    assert_eq!(kind(TaskError::NotFound), ErrorKind::NotFound);
    let invalid = TaskError::Invalid(crate::automation::task::FieldError {
        field: "schedule",
        message: "bad".into(),
    });
    assert_eq!(invalid.to_string(), "schedule: bad");
    assert_eq!(kind(invalid), ErrorKind::InvalidArgument);
    assert_eq!(kind(TaskError::Full), ErrorKind::ResourceExhausted);
    assert_eq!(
        kind(TaskError::Store(Error::internal("disk"))),
        ErrorKind::Internal
    );
}

#[tokio::test(start_paused = true)]
async fn catch_up_after_a_year_down_fires_only_the_latest_minute() {
    let persist = Arc::new(MemoryTasks::new(vec![stored(
        "tick",
        "* * * * *",
        "2025-01-01T00:00:00Z",
        Some("2025-01-05T10:30:00Z"),
        true,
    )]));
    let mut rig = start(persist, "2026-01-05T10:30:30Z", "UTC", true);
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(fire.slot, slot("2026-01-05T10:30:00Z"));
    let (_, fire) = next_fire(&mut rig).await;
    assert_eq!(fire.slot, slot("2026-01-05T10:31:00Z"));
}
