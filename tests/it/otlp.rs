//! Traces over OTLP (`vak serve --otlp-endpoint`, OTEL_EXPORTER_OTLP_ENDPOINT): a collector written for the test (opentelemetry-proto's tonic TraceService) receives the spans of a REST run sent with a W3C traceparent, and checks their tree; without either, nothing is exported.

use crate::support::serve::{Serve, Served};
use crate::support::DEADLINE;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use std::net::SocketAddr;
use tokio::sync::mpsc;
use vak::proto::v1 as pb;

/// The caller's trace: its id and the span the request is made under.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The test's collector: every exported span goes down the channel.
struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in req.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts a collector on 127.0.0.1:0: its address and the spans it receives.
async fn collector() -> (SocketAddr, mpsc::UnboundedReceiver<Span>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (addr, rx)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn attr_str<'a>(span: &'a Span, key: &str) -> &'a str {
    match attr(span, key) {
        Some(AnyValue::StringValue(s)) => s,
        other => panic!("span {} has no string {key}: {other:?}", span.name),
    }
}

fn attr_int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(AnyValue::IntValue(n)) => *n,
        other => panic!("span {} has no integer {key}: {other:?}", span.name),
    }
}

/// A REST run with `wait`, made under the caller's trace, whose prompt
/// writes a file (one tool call between two model calls).
async fn traced_run(served: &Served) -> String {
    run_under(
        served,
        &format!("00-{TRACE_ID}-{CALLER_SPAN}-01"),
        "/write a.txt x",
    )
    .await
}

/// A REST run of `prompt` with `wait` under `traceparent`; its session.
async fn run_under(served: &Served, traceparent: &str, prompt: &str) -> String {
    let api = served.api();
    let sid = api.create_session().await;
    let r = api
        .http()
        .post(format!("{}/sessions/{sid}/run", api.url))
        .header("traceparent", traceparent)
        .json(&json!({"prompt": prompt, "wait": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["result"]["outcome"], "completed", "{body}");
    sid
}

/// A collector and a server that exports to it.
async fn served_with_collector() -> (Served, mpsc::UnboundedReceiver<Span>) {
    let (addr, rx) = collector().await;
    let served = serve()
        .arg("--otlp-endpoint")
        .arg(format!("http://{addr}"))
        .start()
        .await;
    (served, rx)
}

/// Stops the server gracefully (which flushes its exporter) and returns its log.
async fn stop(served: Served) -> String {
    let Served { mut vak, dirs, .. } = served;
    vak.signal("TERM");
    assert!(vak.wait().await.success());
    drop(dirs);
    vak.log()
}

fn serve() -> Serve {
    Serve::new().args([
        "--permission-mode",
        "bypass",
        "--allow-bypass",
        "--first-subscriber-wait-ms",
        "0",
    ])
}

/// Receives spans until `done` says the set is complete, within the deadline.
async fn receive(rx: &mut mpsc::UnboundedReceiver<Span>, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    let mut spans = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done(&spans) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(span)) => spans.push(span),
            _ => panic!(
                "the collector did not get the whole tree in time; it got {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            ),
        }
    }
    spans
}

#[tokio::test]
async fn a_run_is_traced_under_the_callers_traceparent_request_run_model_and_tool_calls() {
    let (served, mut rx) = served_with_collector().await;
    let sid = traced_run(&served).await;
    // Flushed on the way out: the spans of the last run are not lost.
    let log = stop(served).await;
    let spans = receive(&mut rx, |spans| {
        let ours = |name: &str| {
            spans
                .iter()
                .filter(|s| s.name == name && hex(&s.trace_id) == TRACE_ID)
                .count()
        };
        ours("request") >= 1 && ours("run") == 1 && ours("model_call") >= 2 && ours("tool_call") == 1
    })
    .await;
    let ours: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE_ID).collect();
    let one = |name: &str| -> &Span {
        let found: Vec<&&Span> = ours.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span in the caller's trace");
        found[0]
    };

    let request = one("request");
    assert_eq!(
        hex(&request.parent_span_id),
        CALLER_SPAN,
        "the request's parent is the caller's span"
    );
    assert_eq!(attr_str(request, "http.method"), "POST");
    assert_eq!(attr_str(request, "route"), "/sessions/{id}/run");

    let run = one("run");
    assert_eq!(run.parent_span_id, request.span_id, "run → request");
    assert_eq!(attr_str(run, "session"), sid);
    assert!(!attr_str(run, "request_id").is_empty());
    assert_eq!(attr_str(run, "outcome"), "completed");

    let calls: Vec<&&Span> = ours.iter().filter(|s| s.name == "model_call").collect();
    assert_eq!(calls.len(), 2, "the model called the tool, then answered");
    for call in &calls {
        assert_eq!(call.parent_span_id, run.span_id, "model_call → run");
        assert_eq!(attr_str(call, "provider"), "offline");
        assert_eq!(attr_int(call, "attempts"), 1);
        assert!(attr_int(call, "output_tokens") >= 0);
    }
    // The offline model counts the prompt's words as input tokens.
    assert!(calls.iter().map(|c| attr_int(c, "input_tokens")).sum::<i64>() > 0);

    let tool = one("tool_call");
    assert_eq!(tool.parent_span_id, run.span_id, "tool_call → run");
    assert_eq!(attr_str(tool, "tool"), "write_file");
    assert_eq!(attr_str(tool, "outcome"), "ok");
    // In order: the tool ran between the two model calls, inside the run.
    let (first, second) = if calls[0].start_time_unix_nano < calls[1].start_time_unix_nano {
        (calls[0], calls[1])
    } else {
        (calls[1], calls[0])
    };
    assert!(first.end_time_unix_nano <= tool.start_time_unix_nano);
    assert!(tool.end_time_unix_nano <= second.start_time_unix_nano);
    assert!(
        run.start_time_unix_nano <= first.start_time_unix_nano
            && second.end_time_unix_nano <= run.end_time_unix_nano
    );

    // Ledger commits are traces of their own (one batch holds every live run's events).
    let commits: Vec<&Span> = spans.iter().filter(|s| s.name == "ledger_commit").collect();
    assert!(!commits.is_empty(), "ledger commits are traced");
    assert!(
        commits.iter().any(|c| attr_str(c, "session") == sid),
        "the run's session's ledger"
    );
    for c in &commits {
        assert!(c.parent_span_id.is_empty(), "a ledger commit is a root");
        assert!(attr_int(c, "batch_size") >= 1);
        assert!(attr_int(c, "bytes") > 0);
    }

    // The spans never reach the log lines.
    assert!(log.contains("run finished"), "{log}");
    for prefix in ["request{", "run{", "model_call{", "tool_call{", "ledger_commit{"] {
        assert!(!log.contains(prefix), "a span in the log ({prefix}): {log}");
    }
}

#[tokio::test]
async fn a_grpc_call_takes_its_parent_from_the_traceparent_metadata() {
    let (served, mut rx) = served_with_collector().await;
    let api = served.api();
    let sid = api.create_session().await;
    let mut req = tonic::Request::new(pb::RunRequest {
        session_id: sid,
        prompt: "hello".into(),
        request_id: "traced-grpc".into(),
        wait: true,
        ..Default::default()
    });
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let admission = api.grpc().await.run(req).await.unwrap().into_inner();
    assert!(admission.result.is_some(), "the run settled: {admission:?}");
    stop(served).await;
    let spans = receive(&mut rx, |spans| {
        let ours = |name: &str| {
            spans
                .iter()
                .any(|s| s.name == name && hex(&s.trace_id) == TRACE_ID)
        };
        ours("request") && ours("run")
    })
    .await;
    let ours = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name && hex(&s.trace_id) == TRACE_ID)
            .unwrap()
    };
    let request = ours("request");
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(attr_str(request, "rpc.system"), "grpc");
    assert_eq!(attr_str(request, "rpc.service"), "vak.v1.AgentService");
    assert_eq!(attr_str(request, "rpc.method"), "Run");
    assert_eq!(attr_str(request, "route"), "/vak.v1.AgentService/Run");
    let run = ours("run");
    assert_eq!(run.parent_span_id, request.span_id, "run → request");
    assert_eq!(attr_str(run, "request_id"), "traced-grpc");
}

#[tokio::test]
async fn the_environment_variable_turns_the_exporter_on_too_and_an_unsampled_caller_is_not_exported() {
    let (addr, mut rx) = collector().await;
    let served = serve()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .start()
        .await;
    traced_run(&served).await;
    // A caller that does not sample its trace (flags 00): the spans under it are not sampled either.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    run_under(&served, &format!("00-{unsampled}-b7ad6b7169203331-00"), "hello").await;
    stop(served).await;
    let mut spans = receive(&mut rx, |spans| {
        spans
            .iter()
            .any(|s| s.name == "run" && hex(&s.trace_id) == TRACE_ID)
    })
    .await;
    // The exit flushed everything: what else was sent is in the channel already.
    while let Ok(span) = rx.try_recv() {
        spans.push(span);
    }
    assert!(
        !spans.iter().any(|s| hex(&s.trace_id) == unsampled),
        "a span of the unsampled trace was exported"
    );
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_exported() {
    let (addr, mut rx) = collector().await;
    // Only the signal-specific variable, which an exporter built anyway
    // would send to: vak builds none without --otlp-endpoint or
    // OTEL_EXPORTER_OTLP_ENDPOINT.
    let served = serve()
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", format!("http://{addr}"))
        .start()
        .await;
    traced_run(&served).await;
    // A graceful stop would have flushed an exporter: its spans would be in by now.
    let log = stop(served).await;
    assert!(!log.contains("exporting traces"), "{log}");
    assert!(
        rx.try_recv().is_err(),
        "a span reached the collector without an endpoint"
    );
}
