"""The HTTP server: FastAPI routes over the TokenizerManager, and the launcher's serve loop.

    python -m sglang.launch_server [flags]   ->   launch_server(server_args) here

Routes: /generate (SGLang native), /v1/completions, /v1/chat/completions, /v1/models, /server_info
(+ /get_server_info), /get_model_info, /health, /health_generate, /flush_cache, /metrics.
The process layout is SGLang's: this process runs uvicorn and the TokenizerManager on one event loop;
the scheduler rank(s) and the detokenizer are child processes (see engine.launch_subprocesses).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang import __version__
from sglang.srt.entrypoints.engine import LaunchError, launch_subprocesses
from sglang.srt.entrypoints.http_utils import (
    RequestGuardMiddleware,
    error_response,
    install_error_handlers,
    parse_body,
    sse_stream,
    start_generation,
)
from sglang.srt.entrypoints.launch_utils import (
    StartupInterrupted,
    UvicornServer,
    bind_http_socket,
    interrupt_on_signals,
    local_url,
    probe_health,
    restore_signals,
)
from sglang.srt.entrypoints.native_protocol import GenerateRequest, to_generate_input
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat, load_chat_template
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import configure_logger, kill_process_tree

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # in-flight requests get this long to finish after SIGTERM / a fatal error
WARMUP_TIMEOUT_S = 300.0
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ServerState:
    ready: bool = False  # warm-up done: /health answers 200
    shutting_down: bool = False
    exit_code: int = 0


def create_app(tm: TokenizerManager, server_args: ServerArgs) -> FastAPI:
    app = FastAPI(title="sglang (post-capture KV sizing)", version=__version__)
    state = ServerState()
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(
        RequestGuardMiddleware, api_key=server_args.api_key, max_body_bytes=envs.SGLANG_MAX_REQUEST_BODY_BYTES.get()
    )
    # Added last, so outermost: browsers' preflight requests are answered before the key check (as SGLang).
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"], allow_headers=["*"])
    model_name = server_args.served_model_name
    completions = OpenAIServingCompletion(tm, model_name)
    chat = OpenAIServingChat(tm, model_name, server_args.chat_template)

    def with_token_text(out: Any, enabled: bool) -> Any:
        if not enabled or tm.tokenizer is None:
            return out
        for o in out if isinstance(out, list) else [out]:
            for entry in o["meta_info"].get("output_token_logprobs", []):
                entry[2] = tm.tokenizer.decode([entry[1]])
        return out

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(raw: Request):
        req = await parse_body(raw, GenerateRequest)
        obj, rids = to_generate_input(req)
        first, agen = await start_generation(tm, obj, rids, raw)
        text_lp = req.return_text_in_logprobs
        if not req.stream:
            return JSONResponse(with_token_text(first, text_lp))
        events = sse_stream(tm, rids, first, agen, lambda out: [with_token_text(out, text_lp)], lambda last: [])
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def v1_completions(raw: Request):
        return await completions.handle(await parse_body(raw, CompletionRequest), raw)

    @app.post("/v1/chat/completions")
    async def v1_chat_completions(raw: Request):
        return await chat.handle(await parse_body(raw, ChatCompletionRequest), raw)

    @app.get("/v1/models")
    async def v1_models():
        card = ModelCard(id=model_name, root=server_args.model_path, max_model_len=tm.context_len)
        return ModelList(data=[card]).model_dump()

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": server_args.model_path, "tokenizer_path": server_args.tokenizer_path, "is_generation": True}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return {
            **server_args.to_public_dict(),
            **{k: v for k, v in tm.scheduler_info.items() if k != "status"},
            "scheduler_stats": dataclasses.asdict(tm.stats),
            "version": __version__,
        }

    @app.get("/health")
    async def health():
        if tm.fatal_error is not None:
            return error_response(f"unhealthy: {tm.fatal_error}", 503)
        if not state.ready:
            return error_response("the server is starting", 503)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        """Liveness of the whole pipeline: one token through the scheduler and detokenizer."""
        if tm.fatal_error is not None:
            return error_response(f"unhealthy: {tm.fatal_error}", 503)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=rid)
        timeout = envs.SGLANG_HEALTH_CHECK_TIMEOUT.get()
        try:
            await asyncio.wait_for(tm.generate_request(obj).__anext__(), timeout)
        except asyncio.TimeoutError:
            tm.abort_request(rid)
            return error_response(f"no token generated within {timeout:.0f} s (SGLANG_HEALTH_CHECK_TIMEOUT)", 503)
        except RequestError as e:
            return error_response(f"unhealthy: {e.message}", 503)
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        try:
            result = await tm.flush_cache()
        except asyncio.TimeoutError:
            return error_response("the scheduler did not answer the flush request", 500)
        if not result.success:
            return error_response(f"cache not flushed: {result.message}", 400)
        return {"success": True, "message": "Cache flushed."}

    @app.get("/metrics")
    async def metrics():
        return Response(tm.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    return app


# ---------------------------------------------------------------------- serving
async def _warm_up_and_announce(server: uvicorn.Server, tm: TokenizerManager, server_args: ServerArgs,
                                state: ServerState, request_shutdown) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    # One short generation first, so the first user request does not pay one-time costs.
    prompt = {"text": "The capital city of France is"} if tm.tokenizer is not None else {"input_ids": [0, 1, 2]}
    obj = GenerateReqInput(**prompt, sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=f"WARMUP_{uuid.uuid4().hex}")
    try:
        await asyncio.wait_for(tm.generate_request(obj).__anext__(), WARMUP_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - any failure here means the server cannot serve
        request_shutdown(f"the warm-up request failed: {type(e).__name__}: {e}", 1)
        return
    state.ready = True
    if await asyncio.to_thread(probe_health, local_url(server_args), server_args.api_key):
        logger.info("The server is fired up and ready to roll! URL: %s", server_args.url())
    else:
        request_shutdown(f"/health does not answer at {local_url(server_args)}", 1)


async def _serve(server_args: ServerArgs, tm: TokenizerManager, sock: socket.socket) -> int:
    app = create_app(tm, server_args)
    state: ServerState = app.state.server
    config = uvicorn.Config(
        app, host=server_args.host, port=server_args.port, log_level=server_args.log_level, lifespan="off",
        timeout_keep_alive=5, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = UvicornServer(config)

    def request_shutdown(reason: str, exit_code: int) -> None:
        if state.shutting_down:
            server.force_exit = True  # a second Ctrl-C: stop waiting for in-flight requests
            return
        state.shutting_down = True
        state.exit_code = exit_code
        (logger.error if exit_code else logger.info)("Shutting down: %s", reason)
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, request_shutdown, f"received {signal.Signals(sig).name}", 0)
    # A dead scheduler or detokenizer: the tokenizer manager has already failed the in-flight
    # requests with 500s; stop serving and exit non-zero (unless we are the ones stopping them).
    tm.on_fatal = lambda message: None if state.shutting_down else request_shutdown(message, 1)
    tm.start()
    announcer = loop.create_task(_warm_up_and_announce(server, tm, server_args, state, request_shutdown))
    try:
        await server.serve(sockets=[sock])
    finally:
        state.shutting_down = True
        announcer.cancel()
        await tm.stop()
    return state.exit_code


def launch_server(server_args: ServerArgs) -> int:
    """Start the scheduler and detokenizer processes, serve HTTP until a signal or a fatal error.
    Returns the process exit code: 0 after a requested shutdown, 1 when start-up or serving failed."""
    configure_logger(server_args.log_level)
    try:  # checked now, not after the model has loaded
        load_chat_template(server_args.chat_template)
    except (OSError, ValueError) as e:
        logger.error("%s", e)
        return 1
    serves_http = server_args.node_rank == 0  # other nodes of a multi-node deployment only compute
    sock = None
    if serves_http:
        try:
            sock = bind_http_socket(server_args.host, server_args.port)
        except OSError as e:
            logger.error("--host %s --port %d: cannot listen there: %s", server_args.host, server_args.port, e)
            return 1
    # SIGTERM and Ctrl-C abort start-up cleanly (the children are daemonic and are terminated at
    # exit; they also die with this process through PR_SET_PDEATHSIG). While serving, _serve's
    # handlers take over.
    previous = interrupt_on_signals()
    procs: list = []
    try:
        tm, _, procs = launch_subprocesses(server_args)
        if tm is None:
            return _wait_for_children(procs)
        restore_signals(previous)
        return asyncio.run(_serve(server_args, tm, sock))
    except LaunchError as e:
        logger.error("Server start-up failed: %s", e)
        return 1
    except StartupInterrupted as e:
        logger.info("Interrupted by %s", e)
        return 0
    except Exception:  # noqa: BLE001 - anything escaping the serve loop is fatal; report and clean up
        logger.exception("The server failed")
        return 1
    finally:
        restore_signals(previous)
        if sock is not None:
            sock.close()
        if procs:
            kill_process_tree(procs, timeout=5)
            logger.info("All child processes stopped")


def _wait_for_children(procs: list) -> int:
    """A node without HTTP (node_rank > 0) runs until a signal, or until one of its ranks exits."""
    while all(p.is_alive() for p in procs):
        time.sleep(1.0)
    dead = next(p for p in procs if not p.is_alive())
    logger.error("%s exited with code %s", dead.name, dead.exitcode)
    return 1
