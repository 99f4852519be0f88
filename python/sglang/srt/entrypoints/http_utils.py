"""HTTP plumbing shared by the native and OpenAI routes: JSON errors, auth and body-size guard,
server-sent events, and noticing clients that went away.

Every error leaves the server as OpenAI-style JSON, `{"error": {"message", "type", "code"}}`, so
both SGLang-native and `openai`-client users get a readable message and the right status code.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, List, Optional, Sequence, Tuple, Type, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager

logger = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "method_not_allowed",
    413: "request_too_large",
    499: "client_closed_request",
    500: "internal_server_error",
    503: "service_unavailable",
}
SSE_DONE = b"data: [DONE]\n\n"
DISCONNECT_POLL_S = 0.2  # how often a waiting request checks whether its client is still there


def error_body(message: str, status_code: int) -> dict:
    kind = _ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "internal_server_error")
    return {"error": {"message": message, "type": kind, "code": status_code}}


def error_response(message: str, status_code: int) -> JSONResponse:
    return JSONResponse(error_body(message, status_code), status_code=status_code)


# One encoder for every event: json.dumps with any non-default option builds a new encoder per call, a
# measurable share of a streamed chunk's cost at hundreds of streams. allow_nan=False: NaN and infinities are no
# JSON ("-Infinity" breaks every client's parser), refused as Starlette's JSONResponse refuses them.
_SSE_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def sse_event(payload: Any) -> bytes:
    """One event; a payload JSON cannot carry (a NaN or infinite float, a bug) becomes a 500 error event, so a
    stream never carries invalid JSON and the bug is not silent."""
    try:
        text = _SSE_JSON.encode(payload)
    except ValueError as e:
        logger.error("A streamed event is not valid JSON (%s); sent as an error event instead", e)
        text = _SSE_JSON.encode(error_body(f"internal server error: a streamed value is not valid JSON: {e}", 500))
    return b"data: " + text.encode() + b"\n\n"


def describe_validation_errors(errors: List[dict]) -> str:
    """One line per problem, each naming its field (`temperature: Input should be a valid number`)."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":
            return f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "body"
        parts.append(f"{field}: {err.get('msg')}")
    return "; ".join(parts) or "invalid request"


MAX_JSON_DEPTH = 32  # the deepest real bodies (chat messages with content parts) nest 5 levels
PARSE_OFF_LOOP_BYTES = 64 * 1024  # larger bodies are parsed on a worker thread


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def check_json_value(data: Any) -> None:
    """Every string (and key) encodable as UTF-8 (a lone surrogate such as "\\ud800" is not), and no
    nesting deeper than MAX_JSON_DEPTH, so nothing downstream (tokenizer, pydantic, the detokenizer)
    meets what it cannot handle. Iterative: a hostile body cannot exhaust the stack here."""
    stack = [(data, "body", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"{path}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise RequestError(f"{path}: not valid Unicode (a lone surrogate at position {e.start})") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, f"{path} key", depth + 1))
                stack.append((item, key if path == "body" else f"{path}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}", depth + 1) for i, item in enumerate(value))


def decode_json_body(body: bytes) -> dict:
    """Strict JSON (no NaN / Infinity, no out-of-range floats), checked by check_json_value."""
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float) if body.strip() else None
    except RecursionError:
        raise RequestError(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:
        raise RequestError(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    check_json_value(data)
    return data


async def parse_body(request: Request, model: Type[M], strict: bool = False) -> M:
    """The JSON body as `model`, whatever the Content-Type says (`curl -d` sends a form type);
    malformed JSON and wrong field types become 400s that name the problem. `strict`: every value must have its
    field's JSON type, as OpenAI's API requires (`"stream": "yes"` or a prompt of `[true]` is a 400, not coerced);
    an integer still passes where a number is asked for."""
    body = await request.body()
    if len(body) > PARSE_OFF_LOOP_BYTES:
        data = await asyncio.to_thread(decode_json_body, body)
    else:
        data = decode_json_body(body)
    try:
        return model.model_validate(data, strict=strict or None)  # None: the model's own config (/generate's is strict)
    except ValidationError as e:
        raise RequestError(describe_validation_errors(e.errors())) from None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.message, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(describe_validation_errors(exc.errors()), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(str(exc.detail), exc.status_code)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, exc: "ClientDisconnected") -> JSONResponse:
        return error_response("client disconnected", 499)  # nobody reads it; keeps the logs honest

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error while serving a request")
        return error_response(f"internal server error: {type(exc).__name__}: {exc}", 500)


class ClientDisconnected(Exception):
    """The HTTP client went away before its result was ready."""


async def await_or_disconnect(request: Request, awaitable: Awaitable[T], on_disconnect: Callable[[], None]) -> T:
    """Await `awaitable`, but if the client disconnects first cancel it, call `on_disconnect` (which
    aborts the request so its KV cache is freed) and raise ClientDisconnected."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                break
    finally:
        if not task.done():  # client gone, or this handler itself was cancelled (server shutdown)
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - the cancellation (or a late error) is expected here
                pass
            on_disconnect()
    raise ClientDisconnected()


class RequestGuardMiddleware:
    """Pure ASGI middleware (it must not buffer streamed responses or hide disconnects):
    checks the API key and caps the request body at `max_body_bytes` before any route runs."""

    # As in SGLang, liveness probes and Prometheus scrapes work without the key.
    OPEN_PATH_PREFIXES = ("/health", "/metrics")

    def __init__(self, app: Any, api_key: Optional[str], max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def _reply(self, send: Callable, message: str, status: int) -> None:
        body = json.dumps(error_body(message, status)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        if self.api_key and scope.get("method") != "OPTIONS" and not path.startswith(self.OPEN_PATH_PREFIXES):
            if headers.get("authorization", "") != f"Bearer {self.api_key}":
                await self._reply(send, "invalid or missing API key: send `Authorization: Bearer <key>`", 401)
                return
        too_big = f"request body is larger than {self.max_body_bytes} bytes (SGLANG_MAX_REQUEST_BODY_BYTES)"
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._reply(send, too_big, 413)
            return
        # Read the whole body here (it is small) so an oversized chunked upload is refused before
        # any route sees it; then replay it, and pass later messages (disconnects) through.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._reply(send, too_big, 413)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _abort_all(tm: TokenizerManager, rids: Sequence[str]) -> Callable[[], None]:
    def abort() -> None:
        for rid in rids:
            tm.abort_request(rid)

    return abort


async def start_generation(
    tm: TokenizerManager, obj: GenerateReqInput, rids: Sequence[str], raw: Request
) -> Tuple[Any, AsyncIterator[Any]]:
    """Submit and wait for the first output (the final one when not streaming), so that bad input
    is a plain 4xx JSON error before any stream starts. A client that leaves meanwhile is aborted."""
    agen = tm.generate_request(obj)
    first = await await_or_disconnect(raw, agen.__anext__(), _abort_all(tm, rids))
    return first, agen


async def sse_stream(
    tm: TokenizerManager,
    rids: Sequence[str],
    first: dict,
    agen: AsyncIterator[dict],
    events_for: Callable[[dict], List[dict]],
    closing_events: Callable[[dict], List[dict]],
) -> AsyncIterator[bytes]:
    """Turn cumulative outputs into SSE events; `data: [DONE]` ends a stream that was not cut off.
    If the client disconnects, Starlette cancels this generator: the `finally` aborts the request."""
    last = first
    try:
        for event in events_for(first):
            yield sse_event(event)
        async for out in agen:
            last = out
            for event in events_for(out):
                yield sse_event(event)
        for event in closing_events(last):
            yield sse_event(event)
    except RequestError as e:  # e.g. the scheduler died mid-stream: the status line is already sent
        yield sse_event(error_body(e.message, e.status_code))
    finally:
        _abort_all(tm, rids)()  # no-op for finished requests
        try:
            await agen.aclose()
        except BaseException:  # noqa: BLE001 - closing after a cancellation may re-raise it; nothing to do
            pass
    yield SSE_DONE
