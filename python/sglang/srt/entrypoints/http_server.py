"""The HTTP server: FastAPI routes over the TokenizerManager, and the launcher's serve loop.

    python -m sglang.launch_server [flags]   ->   launch_server(config) here

Routes: /generate (SGLang native), /v1/completions, /v1/chat/completions, /v1/responses (+ GET
/v1/responses/{id}), /v1/models, /v1/models/{id}, /server_info (+ /get_server_info), /model_info
(+ /get_model_info), /get_load, /tokenize and /detokenize (+ /v1/ aliases), /health, /health_generate,
/flush_cache, /metrics.
The process layout is SGLang's: this process runs uvicorn and the TokenizerManager on one event loop;
the scheduler rank(s) and the detokenizer are child processes (see engine.launch_subprocesses).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang import __version__
from sglang.srt.entrypoints.engine import launch_subprocesses
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
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from sglang.srt.entrypoints.openai.responses_input import ResponsesRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_responses import OpenAIServingResponses
from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingTokenize
from sglang.srt.entrypoints.server_info import build_load, build_model_info, build_server_info
from sglang.srt.entrypoints.startup_watch import LaunchError
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs

if TYPE_CHECKING:
    from sglang.srt.configs.engine_config import EngineConfig
from sglang.srt.utils.process import configure_logger, freeze_startup_objects, kill_process_tree

logger = logging.getLogger(__name__)

SHUTDOWN_FLUSH_S = 3.0  # after the drain answered every request, their responses get this long to be written
WARMUP_TIMEOUT_S = 300.0
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MODEL_ALIAS = "default"  # the model name the README's examples send; /v1/models/default answers too


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
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"], allow_headers=["*"]
    )
    model_name = server_args.served_model_name
    completions = OpenAIServingCompletion(tm, model_name)
    tokenizing = OpenAIServingTokenize(tm)
    chat = OpenAIServingChat(
        tm, model_name, server_args.chat_template, server_args.tool_call_parser, server_args.reasoning_parser
    )
    responses = OpenAIServingResponses(tm, chat, model_name)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(raw: Request):
        req = await parse_body(raw, GenerateRequest)
        obj, rids = to_generate_input(req)
        first, agen = await start_generation(tm, obj, rids, raw)
        if not req.stream:
            return JSONResponse(first)
        events = sse_stream(tm, rids, first, agen, lambda out: [out], lambda last: [])
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def v1_completions(raw: Request):
        return await completions.handle(await parse_body(raw, CompletionRequest, strict=True), raw)

    @app.post("/v1/chat/completions")
    async def v1_chat_completions(raw: Request):
        return await chat.handle(await parse_body(raw, ChatCompletionRequest, strict=True), raw)

    card = ModelCard(id=model_name, root=server_args.model_path, max_model_len=tm.context_len)
    startup_time = time.time()

    @app.get("/v1/models")
    async def v1_models():
        return ModelList(data=[card]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def v1_model(model_id: str):
        if model_id not in (model_name, DEFAULT_MODEL_ALIAS):
            return error_response(
                f"model {model_id!r} not found; this server serves {model_name!r} (also as {DEFAULT_MODEL_ALIAS!r})",
                404,
            )
        return card.model_dump()

    @app.post("/v1/responses")
    async def v1_responses(raw: Request):
        return await responses.handle(await parse_body(raw, ResponsesRequest, strict=True), raw)

    @app.get("/v1/responses/{response_id}")
    async def v1_response(response_id: str):
        return responses.retrieve(response_id)

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(raw: Request):
        return await tokenizing.tokenize(await parse_body(raw, TokenizeRequest))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(raw: Request):
        return await tokenizing.detokenize(await parse_body(raw, DetokenizeRequest))

    @app.get("/get_load")
    async def get_load():
        return build_load(tm)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return build_model_info(server_args, tm)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return build_server_info(server_args, tm, startup_time)

    def unhealthy(starting_ok: bool = False) -> Optional[str]:
        """Why the server cannot serve now, or None."""
        tm.check_children()
        if tm.fatal_error is not None:
            return f"unhealthy: the engine died: {tm.fatal_error}"
        if state.shutting_down:
            return "the server is shutting down"
        stall_s = envs.SGLANG_HEALTH_STALL_S.get()
        if tm.stalled_for() > stall_s:
            return (
                f"unhealthy: the scheduler has sent no heartbeat for {tm.stalled_for():.0f} s "
                f"(SGLANG_HEALTH_STALL_S={stall_s:g}): it is frozen or stuck in one step"
            )
        if not state.ready and not starting_ok:
            return "the server is starting"
        return None

    @app.get("/health")
    async def health():
        problem = unhealthy()
        return error_response(problem, 503) if problem else Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        """Liveness of the whole pipeline: one token through the scheduler and detokenizer."""
        problem = unhealthy(starting_ok=True)
        if problem:
            return error_response(problem, 503)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        obj = GenerateReqInput(
            input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=rid, log_metrics=False
        )
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
async def _warm_up_and_announce(
    server: uvicorn.Server, tm: TokenizerManager, server_args: ServerArgs, state: ServerState, request_shutdown
) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    if not server_args.skip_server_warmup:
        # One short generation first, so the first user request does not pay one-time costs.
        prompt = {"text": "The capital city of France is"} if tm.tokenizer is not None else {"input_ids": [0, 1, 2]}
        obj = GenerateReqInput(
            **prompt,
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            rid=f"WARMUP_{uuid.uuid4().hex}",
            log_metrics=False,
        )
        try:
            await asyncio.wait_for(tm.generate_request(obj).__anext__(), WARMUP_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - any failure here means the server cannot serve
            request_shutdown(f"the warm-up request failed: {type(e).__name__}: {e}", 1)
            return
    freeze_startup_objects()  # before the first request, as in the scheduler and detokenizer processes
    state.ready = True
    if await asyncio.to_thread(probe_health, local_url(server_args), server_args.api_key):
        logger.info("The server is fired up and ready to roll! URL: %s", server_args.url())
    else:
        request_shutdown(f"/health does not answer at {local_url(server_args)}", 1)


async def _serve(server_args: ServerArgs, tm: TokenizerManager, sock: socket.socket) -> int:
    app = create_app(tm, server_args)
    state: ServerState = app.state.server
    grace_s = envs.SGLANG_SHUTDOWN_GRACE_S.get()
    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        lifespan="off",
        timeout_keep_alive=5,
        # Past our own drain (which answers every request in flight), so uvicorn never has to cancel a handler.
        timeout_graceful_shutdown=grace_s + SHUTDOWN_FLUSH_S,
    )
    server = UvicornServer(config)

    async def drain() -> None:
        """In-flight requests get `grace_s` to finish; then whatever is left is answered 503."""
        deadline = time.monotonic() + grace_s
        while tm.num_in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tm.fail_all("the server is shutting down; this request was aborted", 503)

    def request_shutdown(reason: str, exit_code: int) -> None:
        if state.shutting_down:
            # A second signal: answer everything in flight now and stop waiting for connections.
            tm.fail_all("the server is shutting down now; this request was aborted", 503)
            server.force_exit = True
            return
        state.shutting_down = True
        state.exit_code = exit_code
        (logger.error if exit_code else logger.info)("Shutting down: %s", reason)
        tm.begin_shutdown()  # new requests: 503; the listening socket closes when uvicorn stops
        server.should_exit = True
        drainer.append(loop.create_task(drain()))

    loop = asyncio.get_running_loop()
    drainer: list = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, request_shutdown, f"received {signal.Signals(sig).name}", 0)
    # A dead scheduler or detokenizer: the tokenizer manager has already failed the in-flight
    # requests with 503s; stop serving and exit non-zero (unless we are the ones stopping them).
    tm.on_fatal = lambda message: None if state.shutting_down else request_shutdown(message, 1)
    tm.start()
    announcer = loop.create_task(_warm_up_and_announce(server, tm, server_args, state, request_shutdown))
    try:
        await server.serve(sockets=[sock])
    finally:
        state.shutting_down = True
        announcer.cancel()
        for task in drainer:
            task.cancel()
        await tm.stop()
    return state.exit_code


def launch_server(config: EngineConfig) -> int:
    """Start the scheduler and detokenizer processes, serve HTTP until a signal or a fatal error.
    Returns the process exit code: 0 after a requested shutdown, 1 when start-up or serving failed."""
    server_args = config.args
    configure_logger(server_args.log_level)
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
        tm, _, procs = launch_subprocesses(config)
        if tm is None:
            freeze_startup_objects()
            return _wait_for_children(procs)
        restore_signals(previous)
        return _run_profiled(envs.SGLANG_PROFILE_HTTP_SERVER.get(), lambda: asyncio.run(_serve(server_args, tm, sock)))
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


def _run_profiled(path: str, run: Callable[[], int]) -> int:
    """run(), under cProfile when `path` is set: the top functions are written there at the end."""
    if not path:
        return run()
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(run)
    finally:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(40)
        try:
            with open(path, "w") as f:
                f.write(text.getvalue())
            logger.info("HTTP server profile written to %s", path)
        except OSError as e:  # a diagnostic: a bad path costs the profile, not the shutdown
            logger.error("SGLANG_PROFILE_HTTP_SERVER=%s: cannot write the profile there: %s", path, e)


def _wait_for_children(procs: list) -> int:
    """A node without HTTP (node_rank > 0) runs until a signal, or until one of its ranks exits."""
    while all(p.is_alive() for p in procs):
        time.sleep(1.0)
    dead = next(p for p in procs if not p.is_alive())
    logger.error("%s exited with code %s", dead.name, dead.exitcode)
    return 1
