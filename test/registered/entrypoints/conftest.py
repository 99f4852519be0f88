"""One SmolLM2 server (`--max-total-tokens 16384`, default flags and environment) shared by every test module
here that needs nothing else: test_http_server, test_request_fuzz, test_sglang_clients, test_lm_eval and
test_router (its first replica). A start costs 13-16 s on 2 CPU cores while the suite runs; the server idles
between its users (the scheduler blocks on its socket) and is stopped when the session ends. Tests must not rely
on an empty radix cache or on counters starting at zero."""

import pytest

from sglang.test.test_utils import kill_process_tree, popen_launch_server

SHARED_SERVER_ARGS = ["--max-total-tokens", "16384"]


@pytest.fixture(scope="session")
def smollm2_server():
    proc = popen_launch_server(SHARED_SERVER_ARGS)
    yield proc
    kill_process_tree(proc.pid)
    proc.wait(10)
