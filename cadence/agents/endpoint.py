"""An OpenAI-compatible endpoint over the inference hub, for agents written as programs.

    endpoint = AgentEndpoint(hub, tokenizer)
    await endpoint.start()                       # on the loop the hub serves
    run = endpoint.open_run()                    # one key per agent run
    client = openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key=run)
    ... the agent talks to `client` ...
    trajectory = endpoint.close_run(run)         # its requests, token for token
    samples = trajectory.samples(reward, group_id, prompt_id)

Routes: `/v1/chat/completions` (stream or not, `n`, `temperature`, `top_p`,
`max_tokens`, `stop`, `logprobs`, `tools`/`tool_choice`), `/v1/completions`,
`/v1/models`, and the OpenAI Responses and Anthropic Messages APIs
(`/v1/responses`, `/v1/messages`: `responses_api.py`, `messages_api.py`, which
translate to and from the chat path), each also under `/runs/<run>/v1/...`.

- Attribution: a request belongs to the run named in its path
  (`/runs/<run>/v1`) or, failing that, by its API key. With `strict` (the
  default, for training) a request that names no open run is refused (401),
  so no agent's tokens are lost silently; `strict=False` serves it unrecorded
  (evaluation, debugging).
- Rendering: messages go through the tokenizer's chat template (tools passed
  as `tools=`, the template's own way of showing them), then are encoded
  without adding special tokens: the ids are exactly the template's text.
- Tool calls: parsed from the sampled text in the format the template writes
  (`tool_calls.detect_tool_format`) or `tool_format`; `tool_choice="none"`
  keeps tools in the prompt (so it renders the same) but returns plain text.
  Nothing forces a call: "required" is the model's to honour.
- Limits (docs/agents.md, "Limits"): only requests that name the server
  in Host, carry no foreign Origin and send JSON are served (a web page can
  neither rebind a name to it nor post to it); a body over `max_body_mb` is
  413; `n`, `max_tokens`, sampling parameters and token ids are bounded
  (wire.RequestLimits), and JSON nested past `untrusted_json.MAX_DEPTH` is a
  400. An engine that fails a request makes it a 500 naming the error; the hub
  keeps serving the others.
- Generation: each choice is one `await hub.generate(...)` with the run as
  affinity (its turns stay on one replica and its KV cache). The server runs
  as a task on the hub's loop (`start`), so requests are coroutines beside
  every other caller. The hub hands back whole results, so a stream sends
  each choice's text in one chunk once it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cadence.agents import messages_api, responses_api, untrusted_json, wire
from cadence.agents.tool_calls import (
    TOOL_FORMATS,
    detect_tool_format,
    parse_tool_calls,
    template_messages,
)
from cadence.agents.trajectory import Trajectory
from cadence.http_guards import BodyLimit, HostOriginCheck, allowed_names
from cadence.inference.hub import EngineFailed, InferenceHub
from cadence.inference.types import GenRequest, GenResult

DEFAULT_MAX_N = 16
DEFAULT_MAX_TOKENS_LIMIT = 4096  # when neither max_tokens_limit nor max_context_tokens is set
DEFAULT_MAX_BODY_MB = 8


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C belongs to the training process."""

    @contextlib.contextmanager
    def capture_signals(self):  # noqa: ANN201 (uvicorn's signature)
        yield


class AgentEndpoint:
    """OpenAI-compatible HTTP server over an `InferenceHub` (see module docstring)."""

    def __init__(self, hub: InferenceHub, tokenizer, model_name: str = "cadence", tool_format: str | None = "auto",
                 max_tokens: int = 256, strict: bool = True, port: int = 0,
                 max_context_tokens: int | None = None, max_n: int = DEFAULT_MAX_N,
                 max_tokens_limit: int | None = None, max_body_mb: int = DEFAULT_MAX_BODY_MB) -> None:
        """`max_tokens`: a request's default; `max_tokens_limit` (None: `max_context_tokens`, else
        4096), `max_n` and `max_body_mb`: what a request may ask for and send (module docstring)."""
        if tool_format == "auto":
            tool_format = detect_tool_format(getattr(tokenizer, "chat_template", None))
        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be 'auto', None or one of {TOOL_FORMATS}, got {tool_format!r}")
        self.hub = hub
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.tool_format = tool_format
        cap = max_tokens_limit or max_context_tokens or DEFAULT_MAX_TOKENS_LIMIT
        self.limits = wire.RequestLimits(default_max_tokens=max_tokens, max_tokens=cap, max_n=max_n,
                                         vocab_size=len(tokenizer))
        self.strict = strict
        self.max_context_tokens = max_context_tokens  # prompt + max_tokens must fit (None: unchecked)
        self.port = port
        self.runs: dict[str, Trajectory] = {}
        self.counts = {"requests": 0, "errors": 0, "unrecorded": 0, "disconnected": 0}
        self.closed: dict[str, int] = {"stitched": 0, "rewrite": 0, "rerender": 0, "inserted_tokens": 0}
        self._server: _QuietServer | None = None
        self._task: asyncio.Task | None = None
        self._serving = False  # start() has read the port it bound
        routes = []
        for prefix in ("", "/runs/{run}"):
            routes += [
                Route(prefix + "/v1/chat/completions", self._handler(self._chat), methods=["POST"]),
                Route(prefix + "/v1/completions", self._handler(self._completion), methods=["POST"]),
                Route(prefix + "/v1/models", self._models, methods=["GET"]),
                Route(prefix + "/v1/responses", self._handler(self._responses), methods=["POST"]),
                Route(prefix + "/v1/messages", self._handler(self._messages, messages_api.error_body),
                      methods=["POST"]),
            ]
        guards = [Middleware(HostOriginCheck, names=allowed_names("127.0.0.1"), what="the agent endpoint"),
                  Middleware(BodyLimit, max_bytes=max_body_mb << 20, setting="the endpoint's max_body_mb",
                             advice="send less history, or raise the setting")]
        self.app = Starlette(routes=routes, middleware=guards)

    # -- runs -------------------------------------------------------------------
    def open_run(self, run_id: str | None = None) -> str:
        """A new agent run: requests under its key (or URL) are recorded for it."""
        run_id = run_id or uuid.uuid4().hex
        if run_id in self.runs:
            raise ValueError(f"agent run {run_id!r} is already open")
        self.runs[run_id] = Trajectory(run_id)
        return run_id

    def close_run(self, run_id: str) -> Trajectory:
        """End a run: its trajectory; its later requests are refused (strict) or unrecorded."""
        trajectory = self.runs.pop(run_id)
        self.hub.forget(run_id)
        for name in self.closed:
            self.closed[name] += trajectory.counts[name]
        return trajectory

    @property
    def serving(self) -> bool:
        """Started, with `port` the one it bound (uvicorn's `started` turns true before that)."""
        return self._serving

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def run_url(self, run_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/runs/{run_id}/v1"

    def metrics(self) -> dict[str, float]:
        """Requests served, refused or failed, and how runs' requests were stitched (closed runs)."""
        out = {f"agent/{k}": float(v) for k, v in self.counts.items()}
        out.update({f"agent/{k}": float(v) for k, v in self.closed.items()})
        out["agent/open_runs"] = float(len(self.runs))
        return out

    # -- serving ----------------------------------------------------------------
    async def start(self) -> None:
        """Serve on 127.0.0.1 as a task on the running loop (the one the hub serves)."""
        # Keep-alive far beyond uvicorn's 5 s: on a busy loop an agent's next request can come
        # later than that, and a connection the server closes as it arrives fails the request
        # (256 runs on 2 loaded cores: every run failed with ReadError before).
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", access_log=False, timeout_keep_alive=600)
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start (e.g. the port is taken)
                raise RuntimeError("the agent endpoint stopped while starting")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        self._serving = True

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None
        self._serving = False

    # -- routes -----------------------------------------------------------------
    def _handler(self, serve: Callable[[dict, str | None], Awaitable[Response]],
                 error_body: Callable[[wire.BadRequest], dict] = wire.BadRequest.body):
        async def handle(http: HttpRequest) -> Response:
            self.counts["requests"] += 1
            try:
                run = self._run_of(http)
                try:
                    body = untrusted_json.loads(await http.body())
                except ValueError as e:
                    raise wire.BadRequest("body", f"the request body is not JSON within bounds: {e}") from None
                if not isinstance(body, dict):
                    raise wire.BadRequest("body", "the request body must be a JSON object")
                return await serve(body, run)
            except wire.BadRequest as e:
                self.counts["errors"] += 1
                return JSONResponse(error_body(e), status_code=e.status)
            except ClientDisconnect:  # the run was cancelled while it sent (a stop, a stale group)
                self.counts["disconnected"] += 1
                return Response(status_code=499)  # nobody reads it; uvicorn drops it quietly
        return handle

    async def _models(self, http: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "cadence"}]})

    def _run_of(self, http: HttpRequest) -> str | None:
        run = http.path_params.get("run")
        if run is None:
            auth = http.headers.get("authorization", "")
            run = auth.removeprefix("Bearer ").strip() or http.headers.get("x-api-key") or None  # OpenAI, Anthropic
        if run in self.runs:
            return run
        if self.strict:
            raise wire.BadRequest("api_key", f"no open agent run {run!r}: use the base_url or api_key "
                                  "that AgentEndpoint.open_run gave this run", status=401)
        self.counts["unrecorded"] += 1
        return None

    async def _chat(self, body: dict, run: str | None) -> Response:
        request = wire.parse_chat(body, self.limits)
        prompt_ids, results, replies = await self._sample_chat(request, run)
        choices = []
        for index, (result, (content, calls)) in enumerate(zip(results, replies, strict=True)):
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": index, "message": message, "finish_reason": wire.finish_reason(result, calls),
                      "logprobs": wire.chat_logprobs(self._tokens(result), result) if request.logprobs else None}
            choices.append(choice)
        return self._answer(request, "chat.completion", prompt_ids, results, choices)

    async def _responses(self, body: dict, run: str | None) -> Response:
        request = responses_api.parse(body, self.limits)
        prompt_ids, [result], [reply] = await self._sample_chat(request, run)
        return responses_api.answer(request, self.model_name, prompt_ids, result, reply)

    async def _messages(self, body: dict, run: str | None) -> Response:
        request = messages_api.parse(body, self.limits)
        prompt_ids, [result], [reply] = await self._sample_chat(request, run)
        sampled = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)  # before a stop string cut it
        return messages_api.answer(request, self.model_name, prompt_ids, result, reply, sampled)

    async def _sample_chat(self, request: wire.Request, run: str | None
                           ) -> tuple[list[int], list[GenResult], list[tuple[str | None, list[dict]]]]:
        """The chat path every protocol shares: render the messages, sample `request.n` replies,
        parse each into (content, OpenAI tool_calls)."""
        try:
            messages = template_messages(request.messages)
            text = self.tokenizer.apply_chat_template(messages, tools=request.tools, add_generation_prompt=True,
                                                      tokenize=False)
        except Exception as e:  # the template's own error (a role it does not know, a missing field)
            raise wire.BadRequest("messages", f"the chat template cannot render these messages: {e}") from None
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        results = await self._generate(prompt_ids, request, run, request.messages)
        parse = self.tool_format if request.tools and request.tool_choice != "none" else None
        replies = [parse_tool_calls(r.text, parse) if parse else (r.text, []) for r in results]
        return prompt_ids, results, replies

    async def _completion(self, body: dict, run: str | None) -> Response:
        request = wire.parse_completion(body, self.limits)
        prompt = request.prompt
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
        results = await self._generate(prompt_ids, request, run, None)
        choices = [{"index": i, "text": r.text, "finish_reason": wire.finish_reason(r, []),
                    "logprobs": wire.completion_logprobs(self._tokens(r), r) if request.logprobs else None}
                   for i, r in enumerate(results)]
        return self._answer(request, "text_completion", prompt_ids, results, choices)

    # -- internals --------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], request: wire.Request, run: str | None,
                        messages: list[dict] | None) -> list[GenResult]:
        if not prompt_ids:
            raise wire.BadRequest("prompt", "the prompt renders to no tokens")
        limit, wanted = self.max_context_tokens, len(prompt_ids) + request.params.max_new_tokens
        if limit is not None and wanted > limit:
            raise wire.BadRequest("messages", f"the prompt is {len(prompt_ids)} tokens and max_tokens "
                                  f"{request.params.max_new_tokens}: {wanted} > the context's {limit} tokens; "
                                  "shorten the conversation or lower max_tokens")
        stem = f"{run or 'anon'}-{uuid.uuid4().hex[:12]}"
        reqs = [GenRequest(f"{stem}-{i}", list(prompt_ids), request.params) for i in range(request.n)]
        try:
            results = await asyncio.gather(*(self.hub.generate(r, affinity=run) for r in reqs))
        except EngineFailed as e:
            raise wire.BadRequest("request", f"generation failed: {e}", status=500) from None
        if any(r.finish_reason == "abort" for r in results):
            raise wire.BadRequest("request", "generation was aborted (the run is being cancelled)", status=503)
        trajectory = self.runs.get(run) if run is not None else None
        if trajectory is not None:
            trajectory.record(list(prompt_ids), list(results), messages)
        return list(results)

    def _answer(self, request: wire.Request, kind: str, prompt_ids: list[int], results: list[GenResult],
                choices: list[dict]) -> Response:
        """The response: one JSON object, or its stream of chunks."""
        chat = kind == "chat.completion"
        request_id = wire.new_id("chatcmpl" if chat else "cmpl")
        usage = wire.usage(prompt_ids, results)
        if request.stream:
            chunks = (wire.chat_chunks if chat else wire.completion_chunks)(request_id, self.model_name, choices)
            chunk_kind = "chat.completion.chunk" if chat else "text_completion"
            return self._stream(chunks, request_id, chunk_kind, usage if request.include_usage else None)
        return JSONResponse(wire.envelope(kind, request_id, self.model_name, choices, usage))

    def _tokens(self, result: GenResult) -> list[str]:
        return [self.tokenizer.decode([t]) for t in result.token_ids]

    def _stream(self, chunks: list[dict], request_id: str, kind: str, usage: dict | None) -> Response:
        async def events() -> AsyncIterator[str]:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
            if usage is not None:
                yield f"data: {json.dumps(wire.envelope(kind, request_id, self.model_name, [], usage))}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
