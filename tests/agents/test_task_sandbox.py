"""agent.sandbox: each run gets a sandbox with the task's workspace (a copy of the group's prepared
state, filled before the run asks or when it asks), through a Python handle and over HTTP with a
token scoped to it, and no sandbox outlives its run, whether the run returns, raises, times out or
is cancelled; a sandbox of the group that dies takes none of the prepared state with it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tarfile

import httpx
import pytest

from cadence.agents import AgentEndpoint
from cadence.agents.config import GraderConfig, TaskSandboxConfig
from cadence.agents.grader import Grader
from cadence.agents.producer import AgentProducer
from cadence.agents.task_sandbox import TaskSandboxes
from cadence.inference.hub import InferenceHub
from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.models import SandboxDied, SandboxError
from cadence.sandbox.pool import UnknownSandbox
from tests.agents.repo_task import FIX_COMMAND, FIXED, make_repo, needs_sandbox, task_row
from tests.agents.scripted import ScriptedEngine, tool_tokenizer

pytestmark = needs_sandbox

BASH = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command in the repository.",
                                          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def bash_reply(prompt: str) -> str:
    """A model that fixes the bug with one bash call, then says it is done."""
    if "<tool_response>" in prompt:
        return "done"
    return '<tool_call>\n{"name": "bash", "arguments": ' + json.dumps({"command": FIX_COMMAND}) + "}\n</tool_call>"


async def bash_agent(client, task) -> float:
    """An openai-SDK agent whose bash tool runs in its task sandbox (the handle in task["sandbox"])."""
    assert "tests" not in task and "test_setup" not in task  # the hidden tests are the grader's
    messages = [{"role": "user", "content": task["prompt"]}]
    reply = await client.chat.completions.create(model="cadence", messages=messages, tools=BASH)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        done = await task["sandbox"].aexec(json.loads(call.function.arguments)["command"])
        messages.append({"role": "tool", "tool_call_id": call.id, "content": done.stdout + done.stderr})
    await client.chat.completions.create(model="cadence", messages=messages, tools=BASH)
    return 0.0  # the agent's own number: logged, the grader's counts


def producer_for(agent, rows, sandboxes, **options) -> tuple[AgentProducer, InferenceHub]:
    tok = tool_tokenizer("qwen2")
    hub = InferenceHub([ScriptedEngine(tok, bash_reply)])
    return AgentProducer(AgentEndpoint(hub, tok), agent, rows, 2, eval_tasks=rows, sandboxes=sandboxes,
                         **options), hub


def test_a_group_starts_from_one_prepared_workspace_and_each_run_has_its_own(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (tmp_path / "host.txt").write_text("from the host")
    row = task_row(repo, files={"notes/todo.txt": "fix add"})

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=1, setup="echo prepared > setup.txt"))
        try:
            group = await sandboxes.open_group(row, runs=3)  # one more than the runs: close releases it
            async with group.run() as one, group.run() as two:
                task = one.task(row, hidden=("tests", "test_setup"))
                assert task["sandbox"] is one and task["sandbox_url"].endswith(one.id) and "tests" not in task
                one.write_file("mine.txt", "one's")  # sync ...
                await one.aupload(str(tmp_path / "host.txt"), "up.txt")  # ... and async
                await one.adownload("calc.py", str(tmp_path / "calc_copy.py"))
                seen = (await one.aexec("cat setup.txt notes/todo.txt up.txt; ls")).stdout
                others = two.exec("ls").stdout
                session = [two.exec("cd notes && export X=1", session=True), two.exec("pwd; echo $X", session=True)]
                ids = {one.id, two.id}
                assert ids <= sandboxes.leased  # with the third copy, once it is filled
            assert sandboxes.leased.isdisjoint(ids)  # both released at the end of the block
            for sandbox_id in ids:
                with pytest.raises(UnknownSandbox):
                    group.pool.get(sandbox_id)
            await asyncio.wait(list(group.copies))  # the third, filled (close releases it)
            await group.close()
            return seen, others, session, sandboxes.leased.copy(), dict(sandboxes.counts)
        finally:
            await sandboxes.close()

    seen, others, session, leased, counts = asyncio.run(main())
    assert seen.startswith("prepared\nfix addfrom the host") and "mine.txt" in seen and "calc.py" in seen
    assert "mine.txt" not in others and "setup.txt" in others and "tests" in others
    assert session[1].stdout == "/workspace/notes\n1\n"
    assert (tmp_path / "calc_copy.py").read_text().startswith("def add")
    assert leased == set() and counts == {"acquired": 4, "released": 4}  # the setup's sandbox and 3 copies


def test_a_group_keeps_its_prepared_state_when_its_sandboxes_die(tmp_path):
    row = task_row(make_repo(tmp_path / "repo"))

    def kill(pool, sandbox_ids):  # their processes die; the health round replaces them, empty, in place
        for sandbox_id in sandbox_ids:
            pool.box(sandbox_id).proc.kill()
            pool.box(sandbox_id).proc.wait()
        pool.check()

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=1, http=False, setup="echo prepared > setup.txt"))
        try:
            group = await sandboxes.open_group(row)
            kill(sandboxes.pool, sandboxes.leased)  # whatever the group holds (it held its prepared sandbox)
            async with group.run() as sandbox:
                seen = [sandbox.exec("cat setup.txt").stdout]
            assert seen == ["prepared\n"], "a run of a group whose prepared sandbox died starts empty"
            group.prefill(2)
            filled = [sandbox_id for sandbox_id, _ in await asyncio.gather(*group.copies)]
            kill(sandboxes.pool, filled[:1])  # a copy filled ahead dies before a run takes it
            async with group.run() as one, group.run() as two:
                seen += [one.exec("cat setup.txt").stdout, two.exec("cat setup.txt").stdout]
                given = {one.id, two.id}
            group.prefill(3)
            await group.close()  # while they are being filled: each is released once it is
            for _ in range(200):  # an acquire cancelled mid-start gives its sandbox back in a thread
                if not sandboxes.pool.counts()["busy"]:
                    break
                await asyncio.sleep(0.05)
            busy = sandboxes.pool.counts()["busy"]
            return seen, filled, given, busy, sandboxes.leased.copy(), dict(sandboxes.counts)
        finally:
            await sandboxes.close()

    seen, filled, given, busy, leased, counts = asyncio.run(main())
    assert seen == ["prepared\n"] * 3
    assert filled[0] not in given and filled[1] in given  # the dead one given back, not handed out
    assert busy == 0 and leased == set() and counts["acquired"] == counts["released"] >= 1 + 1 + 2 + 1


def tar_of(*members: tuple[str, str]) -> bytes:
    """A tar of (name, link target) symlinks, or (name, "") files holding 'x'."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def test_a_restored_state_never_writes_through_a_link_or_out_of_the_workspace(tmp_path):
    """A group's state, restored into each run's sandbox, is a snapshot of a workspace the task's
    setup wrote: its links are kept as links, and nothing is written through one."""
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(SandboxError, match="'..' refused"):
        workspace.entries_of(tar_of(("../escape", "")))
    with LocalSandbox(Limits()) as box:
        workspace.restore(box, workspace.entries_of(tar_of(("up", "../.."), ("abs", str(outside)), ("f", ""))))
        with pytest.raises(SandboxError, match="goes through the symlink 'abs'"):
            workspace.restore(box, workspace.entries_of(tar_of(("abs/pwned", ""))))
        listed = box.exec("ls -l; cat f").stdout
    assert "up -> ../.." in listed and f"abs -> {outside}" in listed and listed.endswith("x")
    assert list(outside.iterdir()) == []


def test_the_http_token_reaches_its_own_sandbox_only_and_dies_with_the_run(tmp_path):
    row = task_row(make_repo(tmp_path / "repo"))

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=1))
        try:
            group = await sandboxes.open_group(row)
            async with group.run() as one, group.run() as two, httpx.AsyncClient() as http:
                auth = {"Authorization": f"Bearer {one.token}"}
                base = one.url.rsplit("/", 1)[0]
                calls = {
                    "exec": await http.post(f"{one.url}/exec", headers=auth, json={"cmd": FIX_COMMAND}),
                    "write": await http.post(f"{one.url}/files", headers=auth, json={"path": "new.py", "content": "x"}),
                    "read": await http.get(f"{one.url}/files", headers=auth, params={"path": "calc.py"}),
                    "info": await http.get(one.url, headers=auth),
                    "other's exec": await http.post(f"{two.url}/exec", headers=auth, json={"cmd": "ls"}),
                    "create": await http.post(f"{base}", headers=auth, json={}),
                    "list": await http.get(f"{base}", headers=auth),
                    "stop": await http.delete(one.url, headers=auth),
                    "clients": await http.get(f"{base.rsplit('/', 2)[0]}/v1/clients", headers=auth),
                }
                url = one.url
            after = await httpx.AsyncClient().post(f"{url}/exec", headers=auth, json={"cmd": "ls"})
            await group.close()
            return {k: (r.status_code, r.json()) for k, r in calls.items()}, after.status_code
        finally:
            await sandboxes.close()

    calls, after = asyncio.run(main())
    assert calls["exec"][0] == 200 and calls["exec"][1]["exit_code"] == 0
    assert calls["write"][0] == 200 and calls["info"][0] == 200
    import base64
    assert base64.b64decode(calls["read"][1]["content"]).decode() == FIXED
    for name in ("other's exec", "create", "list", "stop", "clients"):
        assert calls[name][0] == 403 and "one sandbox only" in calls[name][1]["detail"], name
    assert after == 401  # revoked when the run ended


def test_no_sandbox_outlives_a_run_that_returns_raises_times_out_or_is_cancelled(tmp_path):
    row = task_row(make_repo(tmp_path / "repo"))
    entered = []

    async def agent(client, task):
        entered.append(task["sandbox"].id)
        nth = len(entered)
        await client.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "hi"}])
        if nth == 1:
            return 1.0
        if nth == 2:
            raise ValueError("the agent's own bug")
        await asyncio.sleep(3600)  # past agent.timeout_s, or until cancelled

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=1, http=False))
        producer, hub = producer_for(agent, [row], sandboxes, timeout_s=120.0, max_retries=0)

        async def three_groups():
            await producer.play(0, 0)  # run 1 returns, run 2 raises
            producer.timeout_s = 3.0
            await producer.play(1, 1)  # runs 3 and 4 time out
            assert sandboxes.leased == set() and len(entered) == 4
            producer.timeout_s = 3600
            group = asyncio.ensure_future(producer.play(2, 2))  # runs 5 and 6 hang ...
            while len(entered) < 6 or len(sandboxes.leased) < 2:
                await asyncio.sleep(0.05)
            producer.on_weights(1, cancel_before=1)  # ... until cancelled with their weights
            await group
            return producer.failures.health(), sandboxes.leased.copy(), dict(sandboxes.counts)

        try:
            return await hub.serving(three_groups())
        finally:
            await producer.stop()

    counts, leased, acquired = asyncio.run(main())
    assert counts["lost"] == 3 and counts["cancelled"] == 2 and counts["played"] == 4
    assert leased == set() and acquired["acquired"] == acquired["released"] == 3 + 6  # 3 groups, 6 runs


def test_a_bash_tool_through_the_handle_is_graded_by_the_hidden_tests(tmp_path):
    fixed, buggy = task_row(make_repo(tmp_path / "repo")), task_row(make_repo(tmp_path / "other"))
    buggy["test_setup"] = "from calc import add as plus\nadd = lambda a, b: plus(a, b) * 2 + 1"  # no fix passes

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=2, http=False))
        producer, hub = producer_for(bash_agent, [fixed, buggy], sandboxes, grader=Grader(GraderConfig()))

        async def two_groups():
            return [await producer.play(gid, gid) for gid in range(2)], producer.metrics()

        try:
            return await hub.serving(two_groups())
        finally:
            await producer.stop()

    (solved, unsolvable), metrics = asyncio.run(main())
    assert [s.reward for s in solved.samples] == [1.0, 1.0] and [s.reward for s in unsolvable.samples] == [0.0, 0.0]
    assert metrics["agent/grader_graded_total"] == 4 and metrics["agent/returned_reward_mean"] == 0.0
    assert metrics["agent/sandboxes_acquired_total"] == metrics["agent/sandboxes_released_total"] == 2 + 4 + 4


def test_a_run_whose_sandbox_dies_is_replayed_not_scored(tmp_path):
    row = task_row(make_repo(tmp_path / "repo"))
    killed = []

    async def agent(client, task):
        sandbox = task["sandbox"]
        await client.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "hi"}])
        await sandbox.aexec(FIX_COMMAND)
        if not killed:  # a sandbox fault: its process dies under the run (the pool replaces it)
            killed.append(sandbox.id)
            sandbox.pool.box(sandbox.id).proc.kill()
            with contextlib.suppress(SandboxDied):  # unless the health thread replaced it first
                await sandbox.aexec("ls")
        return 0.0

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=1, http=False))
        producer, hub = producer_for(agent, [row], sandboxes, grader=Grader(GraderConfig()))

        async def one_group():
            return await producer.play(0, 0), producer.failures.health(), dict(sandboxes.counts)

        try:
            return await hub.serving(one_group())
        finally:
            await producer.stop()

    group, counts, acquired = asyncio.run(main())
    assert [s.reward for s in group.samples] == [1.0, 1.0]  # the replayed run and the other, both graded
    assert counts["lost"] == 1 and counts["retried"] == 1 and counts["played"] == 3
    assert acquired["acquired"] == acquired["released"]
