"""Workers, dev servers and the PR view over gRPC and over REST (the `unary`
fixture), against a server of its own whose workspace is not a git
repository and has a `.vak/launch.toml`: a fresh session has no workers and
an unknown child is 404; the PR view says `not_a_git_repo` (a reason, not an
error) and best-of-N is refused with it; the launch config is listed, starts,
its output shows in the logs, and it stops."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from helpers import STEP, Server, serving

from vak_client import AsyncClient, Client, VakError, json_name

LAUNCH_TOML = """
[[launch]]
name = "echoer"
command = "echo hello from echoer; echo oops >&2; sleep 30"
env = { GREETING = "hi" }
"""


@pytest.fixture(scope="module")
def bench_vak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # A gh on the server's PATH (one that fails if run), so the PR view gets
    # past "gh_unavailable" to the workspace's own state, wherever it runs.
    bin_dir = tmp_path_factory.mktemp("fake-gh")
    gh = bin_dir / "gh"
    gh.write_text("#!/bin/sh\necho 'fake gh: not for this test' >&2\nexit 1\n")
    gh.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        server = Server(tmp_path_factory.mktemp("vak-workbench"))
    (server.workspace / ".vak").mkdir()
    (server.workspace / ".vak" / "launch.toml").write_text(LAUNCH_TOML)
    yield from serving(server)


@pytest.fixture
def bc(bench_vak: Server, unary: str) -> Iterator[Client]:
    with bench_vak.client(unary=unary) as c:
        yield c


def test_a_fresh_session_has_no_workers_and_another_s_child_is_not_found(bc: Client) -> None:
    sid = bc.create_session()
    assert bc.list_workers(sid) == []
    with pytest.raises(VakError) as e:
        bc.steer_worker(sid, "no-such-child", "go on")
    assert e.value.status == 404
    with pytest.raises(VakError) as e:
        bc.stop_worker(sid, "no-such-child")
    assert e.value.status == 404
    with pytest.raises(VakError) as e:
        bc.list_workers("no-such-session")
    assert e.value.status == 404


def test_outside_git_the_pr_view_says_so_and_best_of_n_is_refused(bc: Client) -> None:
    sid = bc.create_session()
    pr = bc.get_pr(sid)
    assert json_name(pr, "reason") == "not_a_git_repo"
    assert pr.number == 0 and pr.title == ""
    with pytest.raises(VakError) as e:
        bc.start_best_of_n(sid, "write a README", 2)
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    if e.value.body:  # REST: the reason is in the body
        assert '"reason":"not_a_git_repo"' in e.value.body.replace(" ", "")


def test_a_launch_config_is_listed_started_logged_and_stopped(bc: Client) -> None:
    sid = bc.create_session()
    configs = bc.list_launch(sid)
    assert [c.name for c in configs] == ["echoer"]
    echoer = configs[0]
    assert json_name(echoer, "source") == "launch_toml"
    assert echoer.command.startswith("echo hello from echoer")
    assert dict(echoer.env) == {"GREETING": "hi"}
    assert not echoer.running

    started = bc.start_launch(sid, "echoer")
    assert started.name == "echoer" and started.pid > 0
    try:
        with pytest.raises(VakError) as e:
            bc.start_launch(sid, "echoer")
        assert e.value.status == 409
        end = time.monotonic() + STEP
        while True:
            logs = bc.launch_logs(sid, "echoer", tail=10)
            texts = {(json_name(line, "stream"), line.text.strip()) for line in logs.lines}
            if {("stdout", "hello from echoer"), ("stderr", "oops")} <= texts:
                break
            assert time.monotonic() < end, f"the output never reached the logs: {logs}"
            time.sleep(0.05)
        assert logs.running and logs.max_lines > 0
        assert [c.running for c in bc.list_launch(sid)] == [True]
    finally:
        stopped = bc.stop_launch(sid, "echoer")
    assert stopped.name == "echoer" and stopped.was_running
    end = time.monotonic() + STEP
    while bc.list_launch(sid)[0].running:
        assert time.monotonic() < end, "the dev server still runs after stop"
        time.sleep(0.05)
    with pytest.raises(VakError) as e:
        bc.start_launch(sid, "no-such-server")
    assert e.value.status == 404


def test_async_client(bench_vak: Server, unary: str) -> None:
    async def main() -> None:
        async with AsyncClient(bench_vak.url, bench_vak.token, unary=unary) as c:  # type: ignore[arg-type]
            sid = await c.create_session()
            assert await c.list_workers(sid) == []
            with pytest.raises(VakError) as err:
                await c.stop_worker(sid, "no-such-child")
            assert err.value.status == 404
            assert json_name(await c.get_pr(sid), "reason") == "not_a_git_repo"
            assert [x.name for x in await c.list_launch(sid)] == ["echoer"]
            assert (await c.start_launch(sid, "echoer")).pid > 0
            try:
                logs = await c.launch_logs(sid, "echoer", tail=5)
                assert logs.name == "echoer" and logs.max_lines > 0
            finally:
                assert (await c.stop_launch(sid, "echoer")).was_running

    asyncio.run(asyncio.wait_for(main(), STEP))
