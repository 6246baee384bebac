"""Streaming /v1/completions client (asyncio + httpx) that times each call.

TTFT is the time from sending the request to the first streamed chunk that
carries text; e2e is the time to the end of the stream. Token counts come
from the server's usage (stream_options.include_usage).
"""
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Optional

from .workflow import Call


@dataclass
class CallResult:
    call: Call
    start_s: float              # perf_counter at send
    ttft_s: Optional[float]
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    text: str
    error: Optional[str] = None


class Client:
    """One httpx.AsyncClient shared by every call of a configuration.

    extra_body: fields added to every request (ignore_eos, ...);
    hints: send `workflow` / `agent` fields (the workflow API; ignored by servers
    that do not know them).
    """

    def __init__(self, base_url: str, api_key: str = "", extra_body: Optional[dict] = None, hints: bool = True,
                 timeout_s: float = 600.0, max_connections: int = 512):
        import httpx  # here, so the pure modules import without it
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.extra_body = dict(extra_body or {})
        self.hints = hints
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                      timeout=httpx.Timeout(timeout_s, connect=30.0),
                                      limits=httpx.Limits(max_connections=max_connections,
                                                          max_keepalive_connections=max_connections))
        # Calls beyond the pool wait here, not in httpx's pool: cancelling thousands of calls queued in the
        # pool takes minutes (each cancellation rescans the queue), and a --time-limit window must end at once.
        self.slots = asyncio.Semaphore(max_connections)

    async def close(self):
        await self.http.aclose()

    async def get_json(self, path: str) -> dict:
        response = await self.http.get(path)
        response.raise_for_status()
        return response.json()

    async def get_text(self, path: str) -> str:
        response = await self.http.get(path)
        response.raise_for_status()
        return response.text

    async def put_json(self, path: str, body: dict) -> int:
        response = await self.http.put(path, json=body)
        return response.status_code

    def body(self, call: Call, workflow: Optional[str], stream: bool = True) -> dict:
        body = {"model": call.model, "prompt": call.prompt, "max_tokens": call.max_tokens, "temperature": 0.0,
                "stream": stream, **self.extra_body}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.hints and workflow:
            body["workflow"] = workflow
            body["agent"] = call.agent
        return body

    async def complete(self, call: Call, workflow: Optional[str] = None) -> CallResult:
        """Runs one call; an HTTP or stream error becomes CallResult.error."""
        start = time.perf_counter()
        ttft = None
        pieces, usage = [], {}
        num_chunks = 0
        try:
            async with self.slots, self.http.stream("POST", "/v1/completions",
                                                    json=self.body(call, workflow)) as response:
                if response.status_code != 200:
                    detail = (await response.aread())[:300].decode(errors="replace")
                    raise RuntimeError(f"HTTP {response.status_code}: {detail}")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if event.get("error"):
                        raise RuntimeError(f"stream error: {event['error']}")
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices") or []:
                        piece = choice.get("text") or ""
                        # a token whose bytes end mid-character streams as empty text: still a token
                        if piece or choice.get("finish_reason") is None:
                            num_chunks += 1
                            if ttft is None:
                                ttft = time.perf_counter() - start
                            pieces.append(piece)
        except Exception as error:  # one failed call must not abort the run; it is counted
            return CallResult(call, start, ttft, time.perf_counter() - start, 0, 0, "".join(pieces),
                              error=f"{type(error).__name__}: {error}")
        e2e = time.perf_counter() - start
        return CallResult(call, start, ttft if ttft is not None else e2e, e2e,
                          int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or num_chunks),
                          "".join(pieces))

    async def prompt_tokens(self, model: str, prompt: str) -> int:
        """Tokens the server counts for `prompt` (one non-streamed 1-token call)."""
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": False}
        response = await self.http.post("/v1/completions", json=body)
        response.raise_for_status()
        return int(response.json()["usage"]["prompt_tokens"])
