"""`python -m sglang.launch_server [flags]`: parse the flags, start the processes, serve HTTP.

A bad flag exits at once with argparse's usage error naming it (no model is loaded); a failed
start-up or a scheduler that dies later exits non-zero; SIGINT / SIGTERM shut down cleanly.
"""

from __future__ import annotations

import gc
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    # Start-up's imports and model build create some 330,000 objects that live as long as the process; the
    # garbage collector stays off until start-up is done (utils/process.py: freeze_startup_objects, ChildEntry),
    # and is on again when main returns, for a caller that goes on.
    gc.disable()
    try:
        from sglang.srt.server_args import cli_parser, parse_server_args

        parser = cli_parser()
        args = parse_server_args(sys.argv[1:] if argv is None else argv, parser)
        # A missing template fails with the other flag errors, before the model is read.
        from sglang.srt.utils.chat_template import load_chat_template

        try:
            load_chat_template(args.chat_template)
        except (OSError, ValueError) as e:
            parser.error(str(e) if isinstance(e, ValueError) else f"--chat-template: {e}")
        # Imported after parsing, so `--help` and flag errors pay for neither torch nor FastAPI.
        from sglang.srt.configs.engine_config import resolve_or_exit

        config = resolve_or_exit(args, parser)
        from sglang.srt.entrypoints.http_server import launch_server

        return launch_server(config)
    finally:
        gc.enable()


if __name__ == "__main__":
    sys.exit(main())
