//! gRPC end to end with the typed tonic client: every RPC, its agreement with REST, replay and
//! resync cursors, error codes, the bearer token, health and reflection.

use crate::support::*;
use futures_util::StreamExt;
use serde_json::json;
use tonic::Code;
use vak::proto::v1 as pb;

fn run_req(sid: &str, prompt: &str, request_id: &str) -> pb::RunRequest {
    pb::RunRequest {
        session_id: sid.into(),
        prompt: prompt.into(),
        request_id: request_id.into(),
        ..Default::default()
    }
}

fn steer_req(sid: &str, text: &str, request_id: &str) -> pb::SteerRequest {
    pb::SteerRequest {
        session_id: sid.into(),
        text: text.into(),
        request_id: request_id.into(),
        ..Default::default()
    }
}

fn approve_req(sid: &str, rid: &str, approve: Option<bool>) -> pb::ApproveRequest {
    pb::ApproveRequest {
        session_id: sid.into(),
        request_id: rid.into(),
        approve,
        reason: String::new(),
        mode: None,
        always: None,
    }
}

/// The code of a failed call (panics when it succeeded).
#[track_caller]
fn code_of<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(ok) => panic!("expected an error status, got {ok:?}"),
        Err(s) => s.code(),
    }
}

#[tokio::test]
async fn gzip_compressed_requests_are_accepted_and_answers_come_plain() {
    let s = TestServer::start().await;
    let mut grpc = s
        .grpc()
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let created = grpc
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("a gzipped request is served")
        .into_inner();
    let r = grpc
        .run(pb::RunRequest {
            wait: true,
            ..run_req(&created.session_id, "compressed", "")
        })
        .await
        .unwrap();
    // The server never compresses what it sends, even to a client that accepts gzip.
    assert!(r.metadata().get("grpc-encoding").is_none(), "{:?}", r.metadata());
    assert_eq!(r.into_inner().result.unwrap().answer, "echo: compressed");
}

#[tokio::test]
async fn a_session_created_over_grpc_runs_over_rest_and_streams_over_grpc() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = c
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id;
    assert!(!sid.is_empty());

    let (mut events, opened) = grpc_subscribe(&mut c, &sid, None).await;
    assert_eq!(opened.latest_seq, 0, "a new session has published nothing");
    let (code, adm) = s.run(&sid, "hello world").await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("started")));

    let got = events.until("run_finished").await;
    assert_grpc_kinds(
        &got,
        &[
            "status",
            "user_message",
            "turn_started",
            "text_delta",
            "text_delta",
            "text_delta",
            "status",
            "run_finished",
        ],
    );
    assert_grpc_numbered(&got);
    assert_eq!(got[0].seq, 1, "the first event of a session is seq 1");
    assert!(got.iter().all(|e| e.session_id == sid));
    assert_eq!(grpc_text_of(&got), "echo: hello world");
    match &got[1].kind {
        Some(pb::event::Kind::UserMessage(m)) => {
            assert_eq!(m.text, "hello world");
            assert_eq!(m.request_id, adm["request_id"].as_str().unwrap());
        }
        other => panic!("expected user_message, got {other:?}"),
    }
    assert_eq!(outcome_of(got.last().unwrap()), "completed");

    // The same frames, read over SSE from the start, carry the same seqs and kinds.
    let mut sse = s.events(&sid, Some(0)).await;
    let frames = sse.until("run_finished").await;
    let sse_view: Vec<(u64, String)> = frames.iter().map(|f| (f.seq(), f.event.clone())).collect();
    let grpc_view: Vec<(u64, String)> = got.iter().map(|e| (e.seq, kind_of(e).to_string())).collect();
    assert_eq!(sse_view, grpc_view, "REST and gRPC stream the same events");
}

#[tokio::test]
async fn list_attach_and_transcripts_over_grpc_agree_with_rest() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = c
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let (mut events, _) = grpc_subscribe(&mut c, &sid, None).await;
    let adm = c
        .run(run_req(&sid, "/think hmm\nhi there", ""))
        .await
        .unwrap()
        .into_inner();
    // gRPC carries the enum (its JSON name, "started", is what REST shows).
    assert_eq!(adm.state(), pb::AdmissionState::Started);
    assert!(!adm.request_id.is_empty(), "the server generates a request_id");
    let got = events.until("run_finished").await;
    let latest = got.last().unwrap().seq;

    let listed = c
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    let mine = listed
        .iter()
        .find(|x| x.session_id == sid)
        .expect("the session is listed");
    assert_eq!(mine.title, "/think hmm");
    assert_eq!(mine.latest_seq, latest);
    assert!(mine.loaded && !mine.busy);
    let (code, rest_list) = s.get("/sessions").await;
    assert_eq!(code, 200);
    let rest_mine = rest_list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["session_id"] == sid.as_str())
        .unwrap();
    assert_eq!(rest_mine["latest_seq"], latest);
    assert_eq!(rest_mine["created_at"], mine.created_at.as_str());

    let attached = c
        .attach_session(pb::AttachSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .expect("attach returns the session");
    assert_eq!(&attached, mine);

    let t = c
        .get_transcript(pb::GetTranscriptRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.session_id, sid);
    let (code, rest_t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    let rest_msgs = rest_t["messages"].as_array().unwrap();
    assert_eq!(t.messages.len(), 2);
    assert_eq!(rest_msgs.len(), t.messages.len());
    for (g, r) in t.messages.iter().zip(rest_msgs) {
        assert_eq!(
            json!({"role": g.role().json_name(), "text": g.text, "thinking": g.thinking, "seq": g.seq}),
            json!({"role": r["role"], "text": r["text"], "thinking": r["thinking"], "seq": r["seq"]}),
        );
    }
    assert_eq!(t.messages[1].text, "echo: hi there");
    assert_eq!(t.messages[1].thinking.as_deref(), Some("hmm"));
    let usage = t.usage.expect("usage is reported");
    assert!(usage.output_tokens > 0);
    assert_eq!(rest_t["usage"]["output_tokens"], usage.output_tokens);
    assert_eq!(rest_t["usage"]["input_tokens"], usage.input_tokens);

    let md = c
        .get_transcript_markdown(pb::GetTranscriptRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .markdown;
    let (code, _, rest_md) = s.get_text(&format!("/sessions/{sid}/transcript.md")).await;
    assert_eq!(code, 200);
    assert_eq!(md, rest_md, "transcript.md serves GetTranscriptMarkdown");
    assert!(md.contains("echo: hi there"));
}

#[tokio::test]
async fn run_steer_and_cancel_over_grpc_admit_queue_dedup_and_settle_once() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut events, _) = grpc_subscribe(&mut c, &sid, None).await;

    let a = c
        .run(run_req(&sid, "/sleep 60000", "g-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        a,
        pb::Admission {
            request_id: "g-1".into(),
            state: pb::AdmissionState::Started as i32,
            after_seq: 0,
            result: None,
        },
        "a fresh session: every event of the run comes after seq 0"
    );
    events.until("turn_started").await;
    let q = c
        .steer(steer_req(&sid, "more", "g-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.state(), pb::AdmissionState::Queued);
    let dup = c
        .steer(steer_req(&sid, "more", "g-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dup.state(), pb::AdmissionState::Duplicate);
    let (code, dup) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "again", "request_id": "g-1"}),
        )
        .await;
    assert_eq!(
        (code, &dup["request_id"], &dup["state"]),
        (202, &json!("g-1"), &json!("duplicate")),
        "a request_id admitted over gRPC is a duplicate over REST"
    );

    let c1 = c
        .cancel(pb::CancelRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        c1,
        pb::CancelResponse {
            cancelled: true,
            discarded: 1
        }
    );
    let got = events.until("run_finished").await;
    assert_eq!(outcome_of(got.last().unwrap()), "cancelled");
    assert!(
        !got.iter().any(|e| kind_of(e) == "user_message"),
        "the queued steering was discarded: {got:?}"
    );

    // Idle: steering starts a run of its own.
    let st = c.steer(steer_req(&sid, "fresh", "")).await.unwrap().into_inner();
    assert_eq!(st.state(), pb::AdmissionState::Started);
    let got = events.until("run_finished").await;
    assert_eq!(grpc_text_of(&got), "echo: fresh");
    assert_eq!(outcome_of(got.last().unwrap()), "completed");
    let idle = c
        .cancel(pb::CancelRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        idle,
        pb::CancelResponse {
            cancelled: false,
            discarded: 0
        }
    );
}

#[tokio::test]
async fn approvals_over_grpc_resolve_exactly_once() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut events, _) = grpc_subscribe(&mut c, &sid, None).await;
    c.run(run_req(&sid, "/write a.txt from grpc", "")).await.unwrap();
    let got = events.until("approval_requested").await;
    let ask = match &got.last().unwrap().kind {
        Some(pb::event::Kind::ApprovalRequested(a)) => a.clone(),
        _ => unreachable!(),
    };
    assert_eq!(ask.tool, "write_file");
    let path = ask.input.as_ref().unwrap().fields["path"].kind.clone();
    assert_eq!(path, Some(prost_types::value::Kind::StringValue("a.txt".into())));
    assert!(!s.workspace.join("a.txt").exists());

    let r = c.approve(approve_req(&sid, &ask.request_id, None)).await;
    assert_eq!(code_of(r), Code::InvalidArgument, "approve is required");
    let ok = c
        .approve(approve_req(&sid, &ask.request_id, Some(true)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok,
        pb::ApproveResponse {
            request_id: ask.request_id.clone(),
            outcome: pb::ApprovalOutcome::Approved as i32,
            persisted: false,
            rule: None,
        }
    );
    let again = c.approve(approve_req(&sid, &ask.request_id, Some(false))).await;
    assert_eq!(code_of(again), Code::FailedPrecondition, "answered already");
    let unknown = c.approve(approve_req(&sid, "ap_nope", Some(true))).await;
    assert_eq!(code_of(unknown), Code::NotFound);

    let got = events.until("run_finished").await;
    assert_grpc_kinds(&got[..2], &["approval_resolved", "tool_result"]);
    match &got[0].kind {
        Some(pb::event::Kind::ApprovalResolved(r)) => {
            assert_eq!(
                (r.request_id.as_str(), r.outcome()),
                (ask.request_id.as_str(), pb::ApprovalOutcome::Approved)
            )
        }
        _ => unreachable!(),
    }
    assert_eq!(outcome_of(got.last().unwrap()), "completed");
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("a.txt")).unwrap(),
        "from grpc"
    );
}

#[tokio::test]
async fn subscribe_after_replays_exactly_the_frames_after_the_cursor_then_goes_live() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut live, _) = grpc_subscribe(&mut c, &sid, None).await;
    s.run(&sid, "one two three four").await;
    let first = live.until("run_finished").await;
    let latest = first.last().unwrap().seq;
    assert_eq!(first.len() as u64, latest);

    let cursor = 3;
    let (mut replay, opened) = grpc_subscribe(&mut c, &sid, Some(cursor)).await;
    assert_eq!(opened.latest_seq, latest);
    let mut replayed = Vec::new();
    for _ in cursor..latest {
        replayed.push(replay.expect_next().await);
    }
    assert_eq!(
        replayed,
        first[cursor as usize..].to_vec(),
        "exactly the frames after the cursor"
    );

    // Then live: the next run's frames follow, starting right after the replay.
    s.run(&sid, "five").await;
    let next = replay.until("run_finished").await;
    assert_eq!(next[0].seq, latest + 1, "no frame repeated, none skipped");
    assert_grpc_numbered(&next);
    assert_eq!(grpc_text_of(&next), "echo: five");
    assert_eq!(next, live.until("run_finished").await);

    // A cursor at the head replays nothing: the next frame is live.
    let head = next.last().unwrap().seq;
    let (mut at_head, opened) = grpc_subscribe(&mut c, &sid, Some(head)).await;
    assert_eq!(opened.latest_seq, head);
    s.run(&sid, "six").await;
    assert_eq!(at_head.expect_next().await.seq, head + 1);
}

#[tokio::test]
async fn a_cursor_ahead_of_the_session_gets_a_resync_before_the_retained_frames() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut live, _) = grpc_subscribe(&mut c, &sid, None).await;
    s.run(&sid, "hello").await;
    let all = live.until("run_finished").await;
    let latest = all.last().unwrap().seq;

    let (mut ahead, opened) = grpc_subscribe(&mut c, &sid, Some(latest + 100)).await;
    assert_eq!(opened.latest_seq, latest);
    let resync = ahead.expect_next().await;
    assert_eq!(resync.seq, 0, "resync never moves a cursor");
    match &resync.kind {
        Some(pb::event::Kind::Resync(r)) => {
            assert_eq!(
                (r.reason(), r.latest_seq),
                (pb::ResyncReason::CursorAhead, latest)
            )
        }
        other => panic!("expected resync, got {other:?}"),
    }
    let mut retained = Vec::new();
    for _ in 0..latest {
        retained.push(ahead.expect_next().await);
    }
    assert_eq!(retained, all, "every retained frame follows the resync");
}

#[tokio::test]
async fn errors_carry_the_matching_grpc_codes() {
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let nosuch = "nosuch";

    assert_eq!(code_of(c.run(run_req(nosuch, "x", "")).await), Code::NotFound);
    assert_eq!(code_of(c.steer(steer_req(nosuch, "x", "")).await), Code::NotFound);
    let cancel = c
        .cancel(pb::CancelRequest {
            session_id: nosuch.into(),
        })
        .await;
    assert_eq!(code_of(cancel), Code::NotFound);
    let attach = c
        .attach_session(pb::AttachSessionRequest {
            session_id: nosuch.into(),
        })
        .await;
    assert_eq!(code_of(attach), Code::NotFound);
    let t = c
        .get_transcript(pb::GetTranscriptRequest {
            session_id: nosuch.into(),
        })
        .await;
    assert_eq!(code_of(t), Code::NotFound);
    let md = c
        .get_transcript_markdown(pb::GetTranscriptRequest {
            session_id: nosuch.into(),
        })
        .await;
    assert_eq!(code_of(md), Code::NotFound);
    let sub = c
        .subscribe(pb::SubscribeRequest {
            session_id: nosuch.into(),
            after: None,
        })
        .await;
    assert_eq!(code_of(sub), Code::NotFound);

    assert_eq!(code_of(c.run(run_req(&sid, "", "")).await), Code::InvalidArgument);
    assert_eq!(
        code_of(c.run(run_req(&sid, "  \n", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(c.steer(steer_req(&sid, "", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(c.approve(approve_req(&sid, "ap_x", None)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(c.approve(approve_req(&sid, "ap_nope", Some(true))).await),
        Code::NotFound
    );
    assert_eq!(
        code_of(c.run(run_req("../etc", "x", "")).await),
        Code::InvalidArgument,
        "a malformed session id is refused, not looked up"
    );
}

#[tokio::test]
async fn calls_without_a_token_are_unauthenticated_for_unary_and_streaming() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut bare = pb::agent_service_client::AgentServiceClient::new(channel.clone());
    assert_eq!(
        code_of(bare.create_session(pb::CreateSessionRequest::default()).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code_of(bare.list_sessions(pb::ListSessionsRequest {}).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code_of(bare.run(run_req(&sid, "x", "")).await),
        Code::Unauthenticated
    );
    let sub = bare
        .subscribe(pb::SubscribeRequest {
            session_id: sid.clone(),
            after: Some(0),
        })
        .await;
    assert_eq!(code_of(sub), Code::Unauthenticated);

    let mut wrong =
        pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth("wrong".into()));
    assert_eq!(
        code_of(wrong.list_sessions(pb::ListSessionsRequest {}).await),
        Code::Unauthenticated
    );
    let (_, list) = s.get("/sessions").await;
    assert_eq!(
        list["sessions"].as_array().unwrap().len(),
        1,
        "nothing was created without the token"
    );
}

#[tokio::test]
async fn health_check_answers_serving_without_a_token() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let s = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "vak.v1.AgentService"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check of {service:?} fails: {e}"))
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await;
    assert_eq!(code_of(unknown), Code::NotFound);
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_answer_without_a_token_while_the_api_keeps_it() {
    use tonic_reflection::pb::{v1, v1alpha};

    let s = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // No credentials at all: the schema is public (it is proto/ of this repository),
    // so grpcurl and buf curl can discover the API before they hold a token.
    // v1
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(futures_util::stream::iter([req.clone()]))
        .await
        .expect("reflection v1 answers")
        .into_inner();
    let resp = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a reflection answer within the deadline")
        .expect("one response")
        .unwrap();
    let names: Vec<String> = match resp.message_response {
        Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("expected a service list, got {other:?}"),
    };
    assert!(names.iter().any(|n| n == "vak.v1.AgentService"), "{names:?}");
    assert!(names.iter().any(|n| n == "grpc.health.v1.Health"), "{names:?}");

    // v1alpha
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req_alpha = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = alpha
        .server_reflection_info(futures_util::stream::iter([req_alpha.clone()]))
        .await
        .expect("reflection v1alpha answers")
        .into_inner();
    let resp = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a reflection answer within the deadline")
        .expect("one response")
        .unwrap();
    let names: Vec<String> = match resp.message_response {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("expected a service list, got {other:?}"),
    };
    assert!(names.iter().any(|n| n == "vak.v1.AgentService"), "{names:?}");

    // The agent service's descriptor is served too, so grpcurl can call it.
    let symbol = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol("vak.v1.AgentService".into()),
        ),
    };
    let mut stream = client
        .server_reflection_info(futures_util::stream::iter([symbol]))
        .await
        .unwrap()
        .into_inner();
    let resp = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("a reflection answer within the deadline")
        .expect("one response")
        .unwrap();
    match resp.message_response {
        Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(f)) => {
            assert!(!f.file_descriptor_proto.is_empty())
        }
        other => panic!("expected a file descriptor, got {other:?}"),
    }

    // Every other RPC still needs the token.
    let mut bare = pb::agent_service_client::AgentServiceClient::new(channel);
    let r = bare.list_sessions(pb::ListSessionsRequest {}).await;
    assert_eq!(code_of(r), Code::Unauthenticated);
}

#[tokio::test]
async fn a_cursor_older_than_the_ring_is_replayed_from_the_ledger_without_resync() {
    let s = TestServer::start_with(|c| c.core.bus.ring = 4).await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut live, _) = grpc_subscribe(&mut c, &sid, None).await;
    s.run(&sid, "a b c d e").await;
    let all = live.until("run_finished").await;
    let latest = all.last().unwrap().seq;
    assert!(latest > 6);

    let (mut old, _) = grpc_subscribe(&mut c, &sid, Some(1)).await;
    let mut replayed = Vec::new();
    for _ in 1..latest {
        replayed.push(old.expect_next().await);
    }
    assert_eq!(
        replayed,
        all[1..].to_vec(),
        "every frame after the cursor, as first sent"
    );

    // A cursor 10 000 events back, with the default ring of 1024.
    let s = TestServer::start().await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let (mut live, _) = grpc_subscribe(&mut c, &sid, None).await;
    s.run(&sid, "/burst 12000").await;
    let latest = live.until("run_finished").await.last().unwrap().seq;
    let after = latest - 10_000;
    let (mut old, _) = grpc_subscribe(&mut c, &sid, Some(after)).await;
    for seq in after + 1..=latest {
        let e = old.expect_next().await;
        assert!(!matches!(e.kind, Some(pb::event::Kind::Resync(_))), "no resync");
        assert_eq!(e.seq, seq);
    }
}

#[tokio::test]
async fn an_oversized_message_is_refused_and_runs_nothing() {
    let s = TestServer::start_with(|c| c.max_body = 64 * 1024).await;
    let mut c = s.grpc().await;
    let sid = s.create_session().await;
    let big = "x".repeat(100 * 1024);
    let code = code_of(c.run(run_req(&sid, &big, "")).await);
    assert!(
        matches!(code, Code::ResourceExhausted | Code::OutOfRange),
        "a message over the limit is refused as too large: {code:?}"
    );
    let t = c
        .get_transcript(pb::GetTranscriptRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(t.messages.is_empty(), "nothing ran: {t:?}");
    // The connection is still usable afterwards.
    let ok = c.run(run_req(&sid, "small", "")).await.unwrap().into_inner();
    assert_eq!(ok.state(), pb::AdmissionState::Started);
}

#[tokio::test]
async fn unauthenticated_health_watch_and_reflection_streams_count_against_the_caps() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1;

    let s = TestServer::start_with(|c| {
        c.max_streams = 3;
        c.max_streams_per_client = 3;
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let mut watches = Vec::new();
    for _ in 0..2 {
        let mut w = health
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("a watch within the caps")
            .into_inner();
        // The first answer proves the stream is open and holding its slot.
        tokio::time::timeout(DEADLINE, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        watches.push(w);
    }
    // A reflection stream takes the third slot (it stays open until the client ends it).
    let mut reflection = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut info = reflection
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("reflection within the caps")
        .into_inner();
    tx.send(v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    })
    .await
    .unwrap();
    tokio::time::timeout(DEADLINE, info.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let refused = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert_eq!(
        code_of(refused),
        Code::ResourceExhausted,
        "past the caps, without a token too"
    );
    // Unary health checks are not streams: they still answer.
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Check is not capped");
    drop((watches, tx, info));
}
