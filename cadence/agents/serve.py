"""`cadence serve`: a checkpoint in the embedded engine behind the agent endpoint, on 127.0.0.1.

For evaluating and debugging agents outside training: point any OpenAI client
at the printed base_url. Requests are served unrecorded (no run keys needed);
Ctrl-C stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cadence.yaml_config import ConfigError


def serve_model(model_path: str, port: int, tool_format: str, max_tokens: int, max_batch_size: int, seed: int,
                announce: Callable[[str], None] = print, max_n: int = 16, max_tokens_limit: int | None = None,
                max_body_mb: int = 8) -> None:
    """Load `model_path` and serve it until interrupted; `announce` gets the base_url line. `max_n`,
    `max_tokens_limit` and `max_body_mb` bound each request (docs/agents.md, "Limits")."""
    from cadence.agents.config import TOOL_FORMAT_NAMES
    from cadence.agents.endpoint import AgentEndpoint
    from cadence.inference.build import build_engine
    from cadence.inference.config import EngineConfig
    from cadence.inference.hub import InferenceHub
    from cadence.models.loading import load_policy, load_tokenizer, model_path_problem

    problem = model_path_problem(model_path)
    if problem:
        raise ConfigError(f"cadence serve {model_path}: {problem}")
    if tool_format != "auto" and tool_format not in TOOL_FORMAT_NAMES:
        raise ConfigError(f"--tool-format {tool_format!r}: use auto, {', '.join(TOOL_FORMAT_NAMES)}")
    tokenizer = load_tokenizer(model_path)
    policy = load_policy(model_path).eval()
    engine = build_engine(EngineConfig(backend="embedded", max_batch_size=max_batch_size, seed=seed), policy, tokenizer)
    hub = InferenceHub([engine])
    endpoint = AgentEndpoint(hub, tokenizer, model_name=model_path, max_tokens=max_tokens, strict=False, port=port,
                             tool_format="auto" if tool_format == "auto" else TOOL_FORMAT_NAMES[tool_format],
                             max_context_tokens=getattr(policy.config, "max_position_embeddings", None),
                             max_n=max_n, max_tokens_limit=max_tokens_limit, max_body_mb=max_body_mb)

    async def main() -> None:
        await endpoint.start()
        chat = "" if getattr(tokenizer, "chat_template", None) else " (no chat template: /v1/completions only)"
        announce(f"serving {model_path} at {endpoint.base_url}{chat}; model name {model_path!r}; Ctrl-C stops")
        try:
            await asyncio.Event().wait()  # until cancelled (Ctrl-C)
        finally:
            await endpoint.stop()

    try:
        asyncio.run(hub.serving(main()))
    except KeyboardInterrupt:
        pass
