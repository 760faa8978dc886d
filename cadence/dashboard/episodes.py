"""What an episode view needs beyond the sample log's tokens: agent runs' tool calls as turns,
and the episodes a run lost, with their error.

Tool calls. An agent run's sample (cadence/agents/trajectory.py) is the model's replies with
what the agent inserted between them (tool results, user turns, the template's markup: loss
mask 0). A reply's tool calls are in its text, in the markup the endpoint parsed them from
(cadence/agents/tool_calls.py); they are parsed again here, from the tokens the sample log
kept, so a model turn splits into its text and one `call` turn per tool call (name and
arguments, with the tokens that wrote it), and the inserted turn after a call is its `tool`
result. Every token stays in exactly one turn.

Lost episodes. `<run>/env_errors.log` (cadence/rollout/failures.py) holds the first failure
of each kind, with its traceback; the metrics count every lost episode or agent run.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from cadence.agents.tool_calls import hermes_blocks, parse_tool_calls

ENV_ERRORS_FILE = "env_errors.log"
# The formats tried when a run's config does not name one (`auto`: the endpoint chose from the tokenizer).
ALL_FORMATS = ("hermes", "llama3_json")
_CONFIG_FORMATS = {"hermes": ("hermes",), "llama3": ("llama3_json",), "none": ()}
# The first line of each report in env_errors.log: "environment X: an episode (seed 3) was lost: raised during step: ...".
# Found with str.find and patterns anchored at one place, linear in the line: the line holds the
# model's text, and a regex with two `.*?` took seconds (holding the GIL) on a crafted 110 KB line.
_WHO = re.compile(r": (?:an episode|a run) \((?:seed|task) ")
_LOST_AT = ") was lost: "
_KIND = re.compile(r"(\w+ during \w+): ")
_LOST_METRIC = re.compile(r"^(?:rollout/episodes_lost_(\w+)_total|agent/runs_lost_total)$")


def tool_formats(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The tool-call formats to parse an agent run's replies with; () for runs without an agent."""
    agent = cfg.get("agent")
    if not isinstance(agent, dict) or not agent.get("name"):
        return ()
    endpoint = agent.get("endpoint")
    named = endpoint.get("tool_format") if isinstance(endpoint, dict) else None
    return _CONFIG_FORMATS.get(named, ALL_FORMATS) if isinstance(named, str) else ALL_FORMATS


def with_tool_calls(turns: list[dict[str, Any]], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    """`turns` (model / env, cut by the loss mask) with each model turn that wrote tool calls split
    into its text and one `call` turn per call; the env turn after a call becomes its `tool` result."""
    if not formats:
        return turns
    out: list[dict[str, Any]] = []
    called = False
    for turn in turns:
        if turn["role"] == "env":
            out.append({**turn, "role": "tool"} if called else turn)
            continue
        pieces = _split_calls(turn, formats)
        called = len(pieces) > 1 or pieces[0]["role"] == "call"
        out += pieces
    return out


def _split_calls(turn: dict[str, Any], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    text = "".join(turn["tokens"])
    for fmt in formats:
        _, calls = parse_tool_calls(text, fmt)
        if calls:
            break
    else:
        return [turn]
    spans = hermes_blocks(text) if fmt == "hermes" else [(text.find(text.strip()), len(text))]
    if len(spans) != len(calls):  # one llama3 reply holding several calls: its tokens go with the first
        spans += [(len(text), len(text))] * (len(calls) - len(spans))
    starts = [0]  # each token's first character
    for tok in turn["tokens"]:
        starts.append(starts[-1] + len(tok))
    cuts = [0] + [sum(1 for s in starts[:-1] if s < start) for start, _ in spans] + [len(turn["tokens"])]
    pieces = []
    for i, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
        piece = {"role": "model" if i == 0 else "call", "tokens": turn["tokens"][lo:hi],
                 "logprobs": turn["logprobs"][lo:hi]}
        if i > 0:
            function = calls[i - 1]["function"]
            piece["name"] = function["name"]
            piece["arguments"] = function["arguments"]  # JSON text
        if i > 0 or hi > lo:
            pieces.append(piece)
    if "reward" in turn:
        pieces[-1]["reward"] = turn["reward"]
    return pieces


def _report_starts(text: str) -> list[tuple[int, str]]:
    """(offset, kind) of each report's first line in an env_errors.log."""
    found, at = [], 0
    for line in text.split("\n"):  # not splitlines: a report starts after a newline only
        if line.startswith(("environment ", "agent ")):
            lost = line.find(_LOST_AT)
            kind = _KIND.match(line, lost + len(_LOST_AT)) if lost >= 0 and _WHO.search(line, 0, lost) else None
            if kind:
                found.append((at, kind.group(1)))
        at += len(line) + 1
    return found


def lost_episodes(run_dir: Path, last_row: dict[str, Any]) -> dict[str, Any] | None:
    """The episodes (or agent runs) a run lost: how many of each kind (from the metrics) and the
    first report of each kind, message and traceback (from env_errors.log); None when none was."""
    try:
        text = (run_dir / ENV_ERRORS_FILE).read_text(errors="replace")[:200000]
    except OSError:
        text = ""
    found = _report_starts(text)
    ends = [start for start, _ in found[1:]] + [len(text)]
    reports = [{"kind": kind, "text": text[start:end].strip()} for (start, kind), end in zip(found, ends, strict=False)]
    if text.strip() and not reports:  # a log in some other shape: shown whole
        reports = [{"kind": "lost", "text": text.strip()}]
    lost = {}
    for key, value in last_row.items():
        match = _LOST_METRIC.match(key) if isinstance(key, str) else None
        if match and type(value) in (int, float) and value > 0:
            lost[match.group(1) or "agent runs"] = int(value)
    if not (lost or reports):
        return None
    return {"lost": lost, "reports": reports, "worst_task": _worst_task(last_row)}


def _worst_task(last_row: dict[str, Any]) -> dict[str, int] | None:
    """The agent task whose runs were lost most often (cadence/agents/producer.py, LostPerTask)."""
    fields = {"task": "agent/worst_task", "runs": "agent/worst_task_runs", "lost": "agent/worst_task_lost_runs",
              "tasks": "agent/tasks_losing_runs"}
    values = {name: last_row.get(key) for name, key in fields.items()}
    if not all(type(v) in (int, float) and math.isfinite(v) for v in values.values()):
        return None
    return {name: int(v) for name, v in values.items()}
