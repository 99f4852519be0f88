"""`python -m sglang.launch_server [flags]`: parse the flags, start the processes, serve HTTP.

A bad flag exits at once with argparse's usage error naming it (no model is loaded); a failed
start-up or a scheduler that dies later exits non-zero; SIGINT / SIGTERM shut down cleanly.
"""

from __future__ import annotations

import gc
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    # The collector is off while the modules are imported (utils/process.py: freeze_imports says why).
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
        # So does a model path we cannot serve or a weight format we do not run (config.json read as JSON).
        from sglang.srt.configs.errors import ServerArgsError
        from sglang.srt.model_loader.model_source import check_model_path
        from sglang.srt.server_args import DEFAULT_MODEL

        try:
            check_model_path(args.model_path or DEFAULT_MODEL, args.load_format)
        except ServerArgsError as e:
            parser.error(str(e))
        # Imported after parsing, so `--help` and flag errors pay for neither torch nor FastAPI.
        from sglang.srt.configs.engine_config import resolve_or_exit

        config = resolve_or_exit(args, parser)
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.utils.process import freeze_imports
    finally:
        gc.enable()  # also for a caller of main() that goes on after a flag error
    freeze_imports()
    return launch_server(config)


if __name__ == "__main__":
    sys.exit(main())
