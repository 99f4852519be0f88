"""`python -m sglang.launch_server [flags]`: parse the flags, start the processes, serve HTTP.

A bad flag exits at once with argparse's usage error naming it (no model is loaded); a failed
start-up or a scheduler that dies later exits non-zero; SIGINT / SIGTERM shut down cleanly.
"""

from __future__ import annotations

import gc
import sys
from typing import List, Optional

# Start-up builds some 330,000 objects that live as long as the process (torch, transformers, the model), and the
# cyclic garbage collector would scan them again and again: ~870 collections during the imports alone, about a
# CPU-second per server start. It is off from here until start-up is done, in this process and in its children
# (spawn runs this module first in each of them); utils/process.py:freeze_startup_objects then collects once,
# freezes the survivors and turns it back on.
gc.disable()


def main(argv: Optional[List[str]] = None) -> int:
    from sglang.srt.server_args import cli_parser, parse_server_args

    parser = cli_parser()
    args = parse_server_args(sys.argv[1:] if argv is None else argv, parser)
    # Imported after parsing, so `--help` and flag errors pay for neither torch nor FastAPI.
    from sglang.srt.configs.engine_config import resolve_or_exit

    config = resolve_or_exit(args, parser)
    from sglang.srt.entrypoints.http_server import launch_server

    return launch_server(config)


if __name__ == "__main__":
    sys.exit(main())
