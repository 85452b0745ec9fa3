"""The HTTP surface of one simulated replica: the OpenAI API plus the admin routes of the engine
it models (aiohttp): SGLang's (/flush_cache, /get_server_info, /abort_request,
/health_generate) or vLLM 0.26's (POST /reset_prefix_cache, /server_info, /version)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from chatfleet import __version__
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.data.tokenizer import QwenTokenizer
from chatfleet.http.body import BodyLimits, read_object
from chatfleet.http.errors import BadRequest, error_middleware
from chatfleet.http.headers import name_server
from chatfleet.http.models import parse
from chatfleet.simserver.api import AbortRequest, ChatCompletionRequest, CompletionRequest, openapi
from chatfleet.simserver.generation import Answer, AnswerMaker
from chatfleet.simserver.oracle import Oracle
from chatfleet.simserver.replica import Handle, Replica

HEALTH_GENERATE_TIMEOUT_S = 30.0
VLLM_MODEL_VERSION = "0.26.0"  # the vLLM the engine model was read from
# text longer than this is tokenized in a worker thread: `tokenizers` holds the GIL in
# `encode` but releases it in `encode_batch`, and 4 MiB took 3.5 s, every other stream frozen
OFF_LOOP_CHARS = 32 * 1024
BODY_LIMITS = BodyLimits(max_bytes=64 * 1024 * 1024)
log = logging.getLogger("chatfleet.simserver")


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class ReplicaApp:
    def __init__(self, replica: Replica, tok: QwenTokenizer, answers: AnswerMaker,
                 oracle: Oracle | None = None) -> None:
        self.replica = replica
        self.tok = tok
        self.answers = answers
        self.oracle = oracle
        # aiohttp's own 404 and 405 are answered as aiohttp writes them (an engine's differ)
        errors = error_middleware(log, "simserver", answer_http_errors=False)
        self.app = web.Application(middlewares=[errors], client_max_size=BODY_LIMITS.max_bytes)
        name_server(self.app)
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        if replica.spec.engine_model == "vllm":
            r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            r.add_get("/server_info", self.vllm_server_info)
            r.add_get("/version", self.version)
        else:
            r.add_get("/health_generate", self.health_generate)
            r.add_get("/get_server_info", self.server_info)
            r.add_route("*", "/flush_cache", self.flush_cache)
            r.add_post("/abort_request", self.abort_request)
        r.add_get("/metrics", self.metrics)
        r.add_get("/telemetry", self.telemetry)
        r.add_get("/openapi.json", self.openapi)

    # --- parsing --------------------------------------------------------------------------
    async def _encode(self, text: str) -> list[int]:
        """The text's token ids; a long text is tokenized off the event loop (OFF_LOOP_CHARS),
        so the streams of this replica keep their pace meanwhile."""
        if len(text) <= OFF_LOOP_CHARS:
            return self.tok.encode(text)
        [ids] = await asyncio.to_thread(self.tok.encode_batch, [text])
        return ids

    def _max_new(self, prompt_len: int, asked: int | None) -> int:
        sched = self.replica.sched
        room = sched.max_new_tokens_room(prompt_len)
        if asked is None:
            if room < 1:
                raise BadRequest(f"the prompt ({prompt_len} tokens) leaves no room to answer "
                                 f"(context {sched.context_length}, KV pool "
                                 f"{sched.capacity_tokens})", "messages")
            return room
        return asked

    def _admit(self, rid: str | None, prompt: list[int], max_new: int, min_tokens: int,
               ignore_eos: bool, thinking: bool, stop: list[str],
               question: str | None = None) -> Handle:
        why = self.replica.check(len(prompt), max_new)
        if why is not None:
            raise BadRequest(why, "max_tokens" if "max_new_tokens" in why else None)
        if min_tokens > max_new:
            raise BadRequest(f"min_tokens ({min_tokens}) exceeds max_tokens ({max_new})",
                             "min_tokens")
        rid = rid or uuid.uuid4().hex
        if rid in self.replica.handles:
            raise BadRequest(f"request id {rid!r} is already in use", "rid")
        answer = self._oracle_answer(question, max_new, min_tokens, ignore_eos, thinking, stop)
        if answer is None:
            answer = self.answers.make(self.replica.rng, max_tokens=max_new,
                                       min_tokens=min_tokens, ignore_eos=ignore_eos,
                                       thinking=thinking, stop=stop)
        return self.replica.submit(rid, prompt, answer, max_new)

    def _oracle_answer(self, question: str | None, max_new: int, min_tokens: int,
                       ignore_eos: bool, thinking: bool, stop: list[str]) -> Answer | None:
        """Oracle mode: the answer to a question of the oracle's dataset (None otherwise)."""
        if self.oracle is None or question is None:
            return None
        item = self.oracle.match(question)
        if item is None:
            return None
        return self.oracle.make(item, self.tok, self.answers, self.replica.rng,
                                max_tokens=max_new, min_tokens=min_tokens,
                                ignore_eos=ignore_eos, thinking=thinking, stop=stop)

    # --- OpenAI ---------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = parse(ChatCompletionRequest, await read_object(request, BODY_LIMITS))
        kwargs = req.chat_template_kwargs or {}
        thinking = bool(kwargs.get("enable_thinking", True))
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        for m, orig in zip(messages, req.messages, strict=True):
            if isinstance(orig.content, list):
                m["content"] = orig.text()
        try:
            text = self.tok.apply_chat_template(messages, add_generation_prompt=True,
                                                enable_thinking=thinking, tools=req.tools)
        except Exception as exc:  # the template's raise_exception, or a malformed message
            raise BadRequest(f"the chat template rejected the messages: {exc}",
                             "messages") from None
        prompt = await self._encode(text)
        asked = req.max_completion_tokens or req.max_tokens
        max_new = self._max_new(len(prompt), asked)
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        question = users[-1] if users and isinstance(users[-1], str) else None
        h = self._admit(req.rid, prompt, max_new, req.min_tokens, req.ignore_eos, thinking,
                        req.stop_list(), question)
        opts = req.stream_options
        if req.stream:
            return await self._stream(request, h, "chat", opts.include_usage if opts else False,
                                      opts.continuous_usage_stats if opts else False)
        return await self._whole(request, h, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = parse(CompletionRequest, await read_object(request, BODY_LIMITS))
        if isinstance(req.prompt, str):
            prompt = await self._encode(req.prompt)
        else:
            num_ids = self.tok.vocab_size  # read once: each read asks the Rust tokenizer
            if any(t < 0 or t >= num_ids for t in req.prompt):
                raise BadRequest("prompt token ids must be in the vocabulary", "prompt")
            prompt = list(req.prompt)
        if not prompt:
            raise BadRequest("the prompt is empty", "prompt")
        max_new = self._max_new(len(prompt), req.max_tokens)
        h = self._admit(req.rid, prompt, max_new, req.min_tokens, req.ignore_eos, False,
                        req.stop_list(), req.prompt if isinstance(req.prompt, str) else None)
        opts = req.stream_options
        if req.stream:
            return await self._stream(request, h, "text",
                                      opts.include_usage if opts else False,
                                      opts.continuous_usage_stats if opts else False)
        return await self._whole(request, h, "text")

    def _usage(self, h: Handle, completion: int) -> dict[str, Any]:
        return {"prompt_tokens": h.prompt_tokens, "completion_tokens": completion,
                "total_tokens": h.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": h.cached_tokens},
                "reasoning_tokens": min(completion, h.answer.reasoning_tokens)}

    async def _wait(self, h: Handle) -> list[float]:
        await h.wake.wait()
        h.wake.clear()
        planned = h.pending
        h.pending = []
        return planned

    async def _whole(self, request: web.Request, h: Handle, kind: str) -> web.StreamResponse:
        try:
            while not (h.finished or h.aborted):
                planned = await self._wait(h)
                self.replica.record_sent(h, planned)
        except asyncio.CancelledError:
            self.replica.abort(h.rid)
            raise
        finally:
            self.replica.release(h)
        n = h.emitted
        pieces = h.answer.pieces[:n]
        r = min(n, h.answer.reasoning_tokens)
        reason = "abort" if h.aborted and not h.finished else h.finish_reason
        created = int(time.time())
        usage = self._usage(h, n)
        if kind == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(pieces[r:])}
            if h.answer.reasoning_tokens:
                msg["reasoning_content"] = "".join(pieces[:r]).strip("\n")
            return json_response({
                "id": h.rid, "object": "chat.completion", "created": created,
                "model": self.replica.served_model_name,
                "choices": [{"index": 0, "message": msg, "logprobs": None,
                             "finish_reason": reason}],
                "usage": usage})
        return json_response({
            "id": h.rid, "object": "text_completion", "created": created,
            "model": self.replica.served_model_name,
            "choices": [{"index": 0, "text": "".join(pieces), "logprobs": None,
                         "finish_reason": reason}],
            "usage": usage})

    async def _stream(self, request: web.Request, h: Handle, kind: str, include_usage: bool,
                      continuous: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        model = self.replica.served_model_name
        created = int(time.time())
        pieces = h.answer.pieces
        reasoning = h.answer.reasoning_tokens

        def chunk(delta: dict[str, Any] | None, text: str | None, reason: str | None,
                  n: int) -> bytes:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
            if kind == "chat":
                choice["delta"] = delta or {}
            else:
                choice["text"] = text or ""
            body: dict[str, Any] = {"id": h.rid, "object": obj, "created": created,
                                    "model": model, "choices": [choice]}
            if continuous:
                body["usage"] = self._usage(h, n)
            return b"data: " + orjson.dumps(body) + b"\n\n"

        sent = 0
        ready: tuple[int, bytes] | None = None  # (token index, its chunk) rendered ahead

        def render(i: int) -> bytes:
            piece = pieces[i]
            if kind == "chat":
                delta: dict[str, Any] = ({"reasoning_content": piece} if i < reasoning
                                         else {"content": piece})
                if i == 0:
                    delta["role"] = "assistant"
                return chunk(delta, None, None, i + 1)
            return chunk(None, piece, None, i + 1)

        def prerender() -> None:
            nonlocal ready
            if sent < len(pieces):
                ready = (sent, render(sent))

        async def sink(planned: list[float]) -> None:
            """Called by the engine loop after each step with this stream's new tokens."""
            nonlocal sent
            out = []
            for _ in planned:
                if ready is not None and ready[0] == sent:
                    out.append(ready[1])
                else:
                    out.append(render(sent))
                sent += 1
            try:
                await resp.write(b"".join(out))
            except (ConnectionResetError, RuntimeError, OSError):
                self.replica.abort(h.rid)  # the client went away: free its KV now
                return
            self.replica.record_sent(h, planned)

        try:
            await resp.prepare(request)
            h.sink = sink
            h.prerender = prerender
            if h.pending:  # tokens that came before the stream was ready
                planned, h.pending = h.pending, []
                await sink(planned)
            while not (h.finished or h.aborted):
                await h.wake.wait()
                h.wake.clear()
            n = sent
            reason = "abort" if h.aborted and not h.finished else h.finish_reason
            tail = [chunk({}, "", reason, n)]
            if include_usage:
                tail.append(b"data: " + orjson.dumps({
                    "id": h.rid, "object": obj, "created": created, "model": model,
                    "choices": [], "usage": self._usage(h, n)}) + b"\n\n")
            tail.append(b"data: [DONE]\n\n")
            await resp.write(b"".join(tail))
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.replica.abort(h.rid)  # the client went away: free its KV now
            raise
        finally:
            h.sink = None
            h.prerender = None
            self.replica.release(h)
        return resp

    async def models(self, request: web.Request) -> web.Response:
        sched = self.replica.sched
        vllm = self.replica.spec.engine_model == "vllm"
        card: dict[str, Any] = {
            "id": self.replica.served_model_name, "object": "model", "created": 0,
            "owned_by": "vllm" if vllm else "chatfleet-simserver",
            "root": self.replica.served_model_name, "max_model_len": sched.context_length}
        if vllm:
            card.update(created=int(time.time()), parent=None, permission=[])
        return json_response({"object": "list", "data": [card]})

    # --- SGLang's admin surface -------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        prompt = self.tok.encode("ping")
        answer = self.answers.make(self.replica.rng, max_tokens=1, ignore_eos=True)
        h = self.replica.submit(f"health-{uuid.uuid4().hex}", prompt, answer, 1)
        try:
            async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
                while not (h.finished or h.aborted):
                    await self._wait(h)
        except TimeoutError:
            self.replica.abort(h.rid)
            return web.Response(status=503, text="generation did not finish in time")
        finally:
            self.replica.release(h)
        return web.Response(text="")

    async def server_info(self, request: web.Request) -> web.Response:
        rep = self.replica
        sched = rep.sched
        assert isinstance(sched, Scheduler)
        spec = rep.spec
        plan = spec.pool_plan()
        return json_response({
            "engine": "chatfleet-simserver", "version": f"chatfleet {__version__}",
            "model_path": rep.served_model_name, "served_model_name": rep.served_model_name,
            "gpu": spec.gpu.name, "calibrated": spec.is_calibrated,
            "dtype": "bfloat16", "quantization": "fp8" if spec.precision.weights == "fp8"
            else None,
            "kv_cache_dtype": "fp8_e4m3" if spec.precision.kv_cache == "fp8" else "auto",
            "mem_fraction_static": plan.mem_fraction_static,
            "max_total_num_tokens": sched.pool.capacity_tokens,
            "chunked_prefill_size": sched.cfg.chunked_prefill_size,
            "max_running_requests": sched.cfg.max_running,
            "context_length": sched.cfg.context_length,
            "schedule_policy": sched.cfg.schedule_policy,
            "radix_eviction_policy": sched.cfg.eviction_policy,
            "cuda_graph_max_bs": sched.step_model.cuda_graph_max_bs,
            "page_size": 1, "enable_cache_report": True, "enable_metrics": True,
            "hicache_size_tokens": sched.cfg.host_pool_tokens,
            "enable_hierarchical_cache": sched.cfg.host_pool_tokens > 0,
            "hicache_write_policy": sched.cfg.hicache_write_policy,
            "time_scale": rep.time_scale, "thermal_model": sched.thermal is not None,
        })

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.replica.flush_cache():
            return web.Response(text="Cache flushed.\nPlease check backend logs for more "
                                     "details. (When there are running or waiting requests, "
                                     "the operation will not be performed.)\n")
        return web.Response(status=400, text="Cache not flushed. Please check if there are "
                                             "running or waiting requests.\n")

    async def abort_request(self, request: web.Request) -> web.Response:
        req = parse(AbortRequest, await read_object(request, BODY_LIMITS))
        return json_response({"rid": req.rid, "aborted": self.replica.abort(req.rid)})

    # --- vLLM's admin surface ----------------------------------------------------------------
    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM 0.26 answers 200 with {"success": false} while requests hold blocks."""
        return json_response({"success": self.replica.flush_cache()})

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": VLLM_MODEL_VERSION})

    async def vllm_server_info(self, request: web.Request) -> web.Response:
        """The parts of vLLM's /server_info?config_format=json that the harness reads
        (engines/vllm.py), and the simserver's own facts beside them."""
        rep = self.replica
        spec = rep.spec
        plan = spec.vllm_pool_plan()
        sched = rep.sched
        return json_response({
            "vllm_config": {
                "cache_config": {
                    "gpu_memory_utilization": plan.gpu_memory_utilization,
                    "cache_dtype": "fp8" if spec.precision.kv_cache == "fp8" else "auto",
                    "block_size": plan.block_size, "num_gpu_blocks": plan.num_gpu_blocks,
                    "enable_prefix_caching": True, "prefix_caching_hash_algo": "chained tuple",
                    "kv_cache_memory_bytes": (int(plan.kv_cache_gib * 2**30)
                                              if plan.kv_cache_memory_override else None)},
                "scheduler_config": {
                    "max_num_seqs": plan.max_num_seqs,
                    "max_num_batched_tokens": plan.max_num_batched_tokens,
                    "enable_chunked_prefill": True, "policy": "fcfs",
                    "long_prefill_token_threshold": spec.long_prefill_token_threshold},
                "model_config": {
                    "model": rep.served_model_name, "max_model_len": sched.context_length,
                    "dtype": "bfloat16",
                    "quantization": "fp8" if spec.precision.weights == "fp8" else None,
                    "served_model_name": rep.served_model_name},
                "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1},
            },
            "engine": "chatfleet-simserver", "engine_model": "vllm",
            "gpu": spec.gpu.name, "calibrated": spec.is_calibrated,
            "time_scale": rep.time_scale, "thermal_model": sched.thermal is not None,
        })

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.replica.metrics.render(),
                            content_type="text/plain", charset="utf-8")

    async def telemetry(self, request: web.Request) -> web.Response:
        return json_response(self.replica.telemetry())

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi("chatfleet simserver", __version__,
                                     self.replica.spec.engine_model))

