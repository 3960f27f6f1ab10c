//! Finding the server (flags, else $VAK_HOME/server.json, read again when a restarted server refuses the old token) and connecting one of the two `Transport`s to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vak_proto::home;
use vak_proto::v1 as pb;

pub(crate) use super::transport::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransportKind {
    Sse,
    Grpc,
}

pub(crate) fn connect(target: &Target, kind: TransportKind) -> Result<Arc<dyn Transport>, Failure> {
    Ok(match kind {
        TransportKind::Sse => Arc::new(super::rest::Rest::new(target)?),
        TransportKind::Grpc => Arc::new(super::grpc::Grpc::new(target)?),
    })
}

/// Where the server's URL and token come from: the flags, or the home's server.json.
#[derive(Clone, Debug, Default)]
pub(crate) struct Source {
    pub url: Option<String>,
    pub token: Option<String>,
    pub home: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
}

impl Source {
    pub(crate) fn discover(&self) -> Result<Target, Failure> {
        discover(
            self.url.clone(),
            self.token.clone(),
            self.home.clone(),
            self.ca_cert.clone(),
        )
    }

    /// The token comes from server.json, which a restarted (or re-keyed)
    /// server rewrites: worth reading again when the server refuses it.
    pub(crate) fn token_from_file(&self) -> bool {
        self.token.as_ref().is_none_or(|t| t.trim().is_empty())
    }
}

/// The transport for what `source` names. When the token comes from
/// server.json, a call the server refuses (401), or one that cannot reach it,
/// reads server.json again and, if it names another token or URL (the server
/// restarted with a new one), is made again there.
pub(crate) fn open(source: &Source, kind: TransportKind) -> Result<(Target, Arc<dyn Transport>), Failure> {
    let target = source.discover()?;
    let inner = connect(&target, kind)?;
    if !source.token_from_file() {
        return Ok((target, inner));
    }
    let reloading = Reloading {
        source: source.clone(),
        kind,
        name: inner.name(),
        current: std::sync::Mutex::new(Current {
            target: target.clone(),
            transport: inner,
            generation: 0,
        }),
    };
    Ok((target, Arc::new(reloading)))
}

struct Current {
    target: Target,
    transport: Arc<dyn Transport>,
    /// Bumped on every switch, so concurrent failures switch once.
    generation: u64,
}

/// A transport that follows server.json (see `open`).
struct Reloading {
    source: Source,
    kind: TransportKind,
    name: &'static str,
    current: std::sync::Mutex<Current>,
}

impl Reloading {
    fn now(&self) -> (Arc<dyn Transport>, u64) {
        let c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        (c.transport.clone(), c.generation)
    }

    /// The transport to try again with after a failure on generation `tried`:
    /// one another call switched to already, or one for what server.json says
    /// now if that differs; None when there is nothing new to try.
    fn next_after(&self, tried: u64) -> Option<Arc<dyn Transport>> {
        let fresh = self.source.discover().ok();
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if c.generation != tried {
            return Some(c.transport.clone());
        }
        let fresh = fresh?;
        if fresh.url == c.target.url && fresh.token == c.target.token {
            return None;
        }
        let transport = connect(&fresh, self.kind).ok()?;
        c.target = fresh;
        c.transport = transport.clone();
        c.generation += 1;
        Some(transport)
    }

    async fn call<T>(&self, f: impl Fn(Arc<dyn Transport>) -> Fut<'static, T>) -> Result<T, Failure> {
        let (transport, generation) = self.now();
        match f(transport).await {
            Err(e) if e.kind == FailKind::Unauthenticated || e.is_transient() => {
                match self.next_after(generation) {
                    Some(next) => f(next).await,
                    None => Err(e),
                }
            }
            other => other,
        }
    }
}

impl Transport for Reloading {
    fn name(&self) -> &'static str {
        self.name
    }
    fn create_session(&self) -> Fut<'_, String> {
        Box::pin(self.call(|t| Box::pin(async move { t.create_session().await })))
    }
    fn list_sessions(&self) -> Fut<'_, Vec<pb::SessionSummary>> {
        Box::pin(self.call(|t| Box::pin(async move { t.list_sessions().await })))
    }
    fn attach(&self, session_id: &str) -> Fut<'_, pb::SessionSummary> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.attach(&sid).await })
        }))
    }
    fn run(&self, req: pb::RunRequest) -> Fut<'_, pb::Admission> {
        Box::pin(self.call(move |t| {
            let req = req.clone();
            Box::pin(async move { t.run(req).await })
        }))
    }
    fn steer(&self, req: pb::SteerRequest) -> Fut<'_, pb::Admission> {
        Box::pin(self.call(move |t| {
            let req = req.clone();
            Box::pin(async move { t.steer(req).await })
        }))
    }
    fn approve(&self, req: pb::ApproveRequest) -> Fut<'_, pb::ApproveResponse> {
        Box::pin(self.call(move |t| {
            let req = req.clone();
            Box::pin(async move { t.approve(req).await })
        }))
    }
    fn cancel(&self, session_id: &str) -> Fut<'_, pb::CancelResponse> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.cancel(&sid).await })
        }))
    }
    fn transcript(&self, session_id: &str) -> Fut<'_, pb::Transcript> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.transcript(&sid).await })
        }))
    }
    fn presentation(&self, session_id: &str) -> Fut<'_, pb::OutputTimeline> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.presentation(&sid).await })
        }))
    }
    fn list_workers(&self, session_id: &str) -> Fut<'_, Vec<pb::Worker>> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.list_workers(&sid).await })
        }))
    }
    fn list_skills(&self, session_id: Option<&str>) -> Fut<'_, Vec<pb::Skill>> {
        let sid = session_id.map(str::to_string);
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.list_skills(sid.as_deref()).await })
        }))
    }
    fn subscribe(&self, session_id: &str, after: Option<u64>) -> Fut<'_, Events> {
        let sid = session_id.to_string();
        Box::pin(self.call(move |t| {
            let sid = sid.clone();
            Box::pin(async move { t.subscribe(&sid, after).await })
        }))
    }
}

/// `--url` and `--token` when given; otherwise (or for the token alone) the
/// server.json that `vak serve` writes in its home.
pub(crate) fn discover(
    url: Option<String>,
    token: Option<String>,
    home: Option<PathBuf>,
    ca_cert: Option<PathBuf>,
) -> Result<Target, Failure> {
    let token = token.filter(|t| !t.trim().is_empty());
    let dev_cert = home::resolve(home.clone())
        .ok()
        .map(|h| h.join("tls").join("dev-cert.pem"))
        .filter(|p| p.exists());
    let from_file = || -> Result<(String, String), Failure> {
        let home = home::resolve(home.clone()).map_err(|e| Failure::fatal(e.message))?;
        let path = home::server_json(&home);
        let raw = std::fs::read(&path).map_err(|e| {
            Failure::fatal(if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "no server found: {} does not exist (start one with `vak serve`, or pass --url and --token)",
                    path.display()
                )
            } else {
                format!("cannot read {}: {e}", path.display())
            })
        })?;
        let v: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| Failure::fatal(format!("{} is not JSON: {e}", path.display())))?;
        let field = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_str())
                .map(str::to_string)
                .ok_or_else(|| Failure::fatal(format!("{} has no {k:?}", path.display())))
        };
        Ok((field("url")?, field("token")?))
    };
    let target = match (url, token) {
        (Some(url), Some(token)) => Target {
            url,
            token,
            ca_pem: None,
        },
        (Some(url), None) => {
            // The token of a local server whose URL was given explicitly.
            let (file_url, file_token) = from_file()
                .map_err(|_| Failure::fatal(format!("--url {url} needs --token (or VAK_TOKEN)")))?;
            if file_url.trim_end_matches('/') != url.trim_end_matches('/') {
                return Err(Failure::fatal(format!(
                    "--url {url} needs --token (or VAK_TOKEN)"
                )));
            }
            Target {
                url,
                token: file_token,
                ca_pem: None,
            }
        }
        (None, token) => {
            let (url, file_token) = from_file()?;
            Target {
                url,
                token: token.unwrap_or(file_token),
                ca_pem: None,
            }
        }
    };
    let ca_path = ca_cert.or(if target.url.starts_with("https://") {
        dev_cert
    } else {
        None
    });
    let ca_pem = match ca_path {
        Some(p) => {
            Some(std::fs::read(&p).map_err(|e| Failure::fatal(format!("cannot read {}: {e}", p.display())))?)
        }
        None => None,
    };
    if !(target.url.starts_with("http://") || target.url.starts_with("https://")) {
        return Err(Failure::fatal(format!(
            "the server URL {:?} must start with http:// or https://",
            target.url
        )));
    }
    Ok(Target {
        url: target.url.trim_end_matches('/').to_string(),
        token: target.token.trim().to_string(),
        ca_pem,
    })
}

/// Retries a call that is safe to repeat (every call vak term repeats carries
/// its request id, or is idempotent) while it fails transiently, a few times.
pub(crate) async fn retry<T, F>(mut call: F) -> Result<T, Failure>
where
    F: FnMut() -> Fut<'static, T>,
{
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        match call().await {
            Err(f) if f.is_transient() && attempt < 8 => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Convenience wrappers that clone what a retried call needs into a `'static` future.
pub(crate) fn run_call(
    conn: &Arc<dyn Transport>,
    req: pb::RunRequest,
) -> impl FnMut() -> Fut<'static, pb::Admission> {
    let conn = conn.clone();
    move || {
        let (conn, req) = (conn.clone(), req.clone());
        Box::pin(async move { conn.run(req).await })
    }
}

pub(crate) fn steer_call(
    conn: &Arc<dyn Transport>,
    req: pb::SteerRequest,
) -> impl FnMut() -> Fut<'static, pb::Admission> {
    let conn = conn.clone();
    move || {
        let (conn, req) = (conn.clone(), req.clone());
        Box::pin(async move { conn.steer(req).await })
    }
}

pub(crate) fn cancel_call(
    conn: &Arc<dyn Transport>,
    session_id: &str,
) -> impl FnMut() -> Fut<'static, pb::CancelResponse> {
    let (conn, sid) = (conn.clone(), session_id.to_string());
    move || {
        let (conn, sid) = (conn.clone(), sid.clone());
        Box::pin(async move { conn.cancel(&sid).await })
    }
}

/// A plain answer to an approval: yes or no, nothing else.
pub(crate) fn approval(
    session_id: &str,
    request_id: &str,
    approve: bool,
    reason: &str,
) -> pb::ApproveRequest {
    pb::ApproveRequest {
        session_id: session_id.to_string(),
        request_id: request_id.to_string(),
        approve: Some(approve),
        reason: reason.to_string(),
        mode: None,
        always: None,
    }
}

/// How `request_id` of `session_id` was settled, read from the presentation
/// timeline (None: not settled, or no such approval item).
async fn settled_outcome(
    conn: &dyn Transport,
    session_id: &str,
    request_id: &str,
) -> Option<ApprovalOutcome> {
    let timeline = conn.presentation(session_id).await.ok()?;
    timeline
        .items
        .iter()
        .find(|i| i.kind() == pb::ItemKind::Approval && i.request_id == request_id)
        .and_then(|i| ApprovalOutcome::from_status(i.status()))
}

/// Answers an approval. A retry after a lost answer finds it already settled
/// (409): that is success when the settled outcome, read from the session's
/// presentation timeline, is the one we sent (what became of an `always`
/// rule is then unknown: `persisted` is false).
pub(crate) async fn answer_approval(
    conn: &Arc<dyn Transport>,
    req: pb::ApproveRequest,
) -> Result<pb::ApproveResponse, Failure> {
    check_id("approval id", &req.request_id)?;
    let want = if req.approve.unwrap_or(false) {
        ApprovalOutcome::Approved
    } else {
        ApprovalOutcome::Denied
    };
    let mut sent_once = false;
    let c = conn.clone();
    retry(move || {
        let (c, req) = (c.clone(), req.clone());
        let retried = sent_once;
        sent_once = true;
        Box::pin(async move {
            match c.approve(req.clone()).await {
                Err(f) if retried && f.kind == FailKind::Conflict => {
                    if settled_outcome(&*c, &req.session_id, &req.request_id).await == Some(want) {
                        Ok(pb::ApproveResponse {
                            outcome: want.to_pb() as i32,
                            ..pb::ApproveResponse::default()
                        })
                    } else {
                        Err(f)
                    }
                }
                other => other,
            }
        })
    })
    .await
}

/// Answers an approval; an `always` the server refuses (a call no rule can
/// cover) is sent again as a plain approval, so the question never stays
/// unanswered: the answer, and why no rule was kept.
pub(crate) async fn answer_always_or_once(
    conn: &Arc<dyn Transport>,
    req: pb::ApproveRequest,
) -> Result<(pb::ApproveResponse, Option<Failure>), Failure> {
    if req.always != Some(true) {
        return Ok((answer_approval(conn, req).await?, None));
    }
    let once = pb::ApproveRequest {
        always: None,
        ..req.clone()
    };
    match answer_approval(conn, req).await {
        Err(f) if f.kind == FailKind::Fatal => Ok((answer_approval(conn, once).await?, Some(f))),
        other => Ok((other?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_url_and_token_win() {
        let t = discover(Some("http://127.0.0.1:9/".into()), Some(" T ".into()), None, None).unwrap();
        assert_eq!((t.url.as_str(), t.token.as_str()), ("http://127.0.0.1:9", "T"));
    }

    #[test]
    fn server_json_is_read_from_the_home() {
        let home = tempfile::tempdir().unwrap();
        let err = discover(None, None, Some(home.path().into()), None).unwrap_err();
        assert!(err.message.contains("no server found"), "{err}");
        home::write_server_json(home.path(), "http://127.0.0.1:7", "tok").unwrap();
        let t = discover(None, None, Some(home.path().into()), None).unwrap();
        assert_eq!((t.url.as_str(), t.token.as_str()), ("http://127.0.0.1:7", "tok"));
        // --url naming the same server takes the token from the file; another server needs --token.
        let t = discover(
            Some("http://127.0.0.1:7".into()),
            None,
            Some(home.path().into()),
            None,
        )
        .unwrap();
        assert_eq!(t.token, "tok");
        assert!(discover(
            Some("http://127.0.0.1:8".into()),
            None,
            Some(home.path().into()),
            None
        )
        .is_err());
    }

    #[test]
    fn server_json_is_followed_only_when_the_token_came_from_it() {
        let from_file = |token: Option<&str>| {
            Source {
                token: token.map(str::to_string),
                ..Source::default()
            }
            .token_from_file()
        };
        assert!(from_file(None));
        assert!(from_file(Some(" ")), "an empty VAK_TOKEN is no token");
        assert!(!from_file(Some("T")), "--token or VAK_TOKEN is used as given");
    }

    #[test]
    fn urls_need_a_scheme_and_ids_the_server_rule() {
        assert!(discover(Some("127.0.0.1:9".into()), Some("t".into()), None, None).is_err());
        assert!(check_id("session id", "abc-DEF_09").is_ok());
        for bad in ["", "a/b", "a.b", &"x".repeat(65)] {
            assert!(check_id("session id", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_refused_id_gets_vak_protos_message() {
        let f = check_id("approval id", "a/b").unwrap_err();
        let e = vak_proto::ids::validate_plain_id("approval id", "a/b").unwrap_err();
        assert_eq!((f.kind, f.message), (FailKind::Fatal, e.message));
    }

    /// A server whose first answer to an approval is lost (transient) and
    /// whose second is 409, with the approval settled as `status` says.
    struct Settled {
        status: &'static str,
        approves: std::sync::atomic::AtomicUsize,
    }

    impl Transport for Settled {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn create_session(&self) -> Fut<'_, String> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn list_sessions(&self) -> Fut<'_, Vec<pb::SessionSummary>> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn attach(&self, _: &str) -> Fut<'_, pb::SessionSummary> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn run(&self, _: pb::RunRequest) -> Fut<'_, pb::Admission> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn steer(&self, _: pb::SteerRequest) -> Fut<'_, pb::Admission> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn approve(&self, _: pb::ApproveRequest) -> Fut<'_, pb::ApproveResponse> {
            let n = self.approves.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                Err(match n {
                    0 => Failure::transient("the answer was lost"),
                    // The message no longer says how: the outcome comes from the timeline.
                    _ => Failure::new(FailKind::Conflict, "approval ap_1 is already settled"),
                })
            })
        }
        fn cancel(&self, _: &str) -> Fut<'_, pb::CancelResponse> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn transcript(&self, _: &str) -> Fut<'_, pb::Transcript> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn list_workers(&self, _: &str) -> Fut<'_, Vec<pb::Worker>> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn list_skills(&self, _: Option<&str>) -> Fut<'_, Vec<pb::Skill>> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
        fn presentation(&self, session_id: &str) -> Fut<'_, pb::OutputTimeline> {
            let items = vec![
                pb::TimelineItem {
                    kind: pb::ItemKind::Approval as i32,
                    status: pb::ItemStatus::Denied as i32,
                    request_id: "ap_0".into(),
                    ..Default::default()
                },
                pb::TimelineItem {
                    kind: pb::ItemKind::Approval as i32,
                    status: pb::ItemStatus::from_json_name(self.status).unwrap() as i32,
                    request_id: "ap_1".into(),
                    ..Default::default()
                },
            ];
            let session_id = session_id.to_string();
            Box::pin(async move {
                Ok(pb::OutputTimeline {
                    session_id,
                    items,
                    ..Default::default()
                })
            })
        }
        fn subscribe(&self, _: &str, _: Option<u64>) -> Fut<'_, Events> {
            Box::pin(async { Err(Failure::fatal("unused")) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_answer_that_finds_its_approval_settled_its_way_succeeds_and_any_other_way_is_the_conflict(
    ) {
        for (status, approve, ok) in [
            ("approved", true, true),
            ("denied", false, true),
            ("denied", true, false),
            ("expired", true, false),
            ("pending", false, false),
        ] {
            let conn: Arc<dyn Transport> = Arc::new(Settled {
                status,
                approves: Default::default(),
            });
            let got = answer_approval(&conn, approval("s1", "ap_1", approve, "")).await;
            match got {
                Ok(r) => {
                    assert!(ok, "{status} after approve={approve} is not a success");
                    assert_eq!(
                        r.outcome(),
                        if approve {
                            pb::ApprovalOutcome::Approved
                        } else {
                            pb::ApprovalOutcome::Denied
                        }
                    );
                }
                Err(f) => {
                    assert!(!ok, "{status} after approve={approve}: {f}");
                    assert_eq!(f.kind, FailKind::Conflict);
                }
            }
        }
    }

    #[test]
    fn approval_outcomes_read_the_wire_enums_and_nothing_else() {
        for (o, status) in [
            (ApprovalOutcome::Approved, pb::ItemStatus::Approved),
            (ApprovalOutcome::Denied, pb::ItemStatus::Denied),
            (ApprovalOutcome::Expired, pb::ItemStatus::Expired),
        ] {
            assert_eq!(ApprovalOutcome::from_pb(o.to_pb()), Some(o));
            assert_eq!(ApprovalOutcome::from_status(status), Some(o));
        }
        assert_eq!(ApprovalOutcome::from_status(pb::ItemStatus::Pending), None);
        assert_eq!(ApprovalOutcome::from_pb(pb::ApprovalOutcome::Unspecified), None);
    }
}
