"""`radixrt serve ...` (flags derived from ServerConfig, SGLang's names) and `radixrt bench <name> ...`."""
from __future__ import annotations

import argparse
import os
import pathlib
import runpy
import sys

from radixrt.runtime.config import ServerConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description="radixrt: structured-generation LLM runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the HTTP server (SGLang-native and OpenAI-compatible API)")
    ServerConfig.add_cli_args(serve)
    # "module:Class" with the Scheduler interface; tests use it to serve without a model
    serve.add_argument("--scheduler-class", default=None, help=argparse.SUPPRESS)
    bench = sub.add_parser("bench", help="run a benchmark from benchmarks/ (e.g. `radixrt bench serving --help`)")
    bench.add_argument("name", help="benchmark name: benchmarks/bench_<name>.py")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            config = ServerConfig.from_cli_args(args)
        except ValueError as e:
            parser.error(str(e))
        from radixrt.runtime.serving.launch import launch_server
        code = launch_server(config, args.scheduler_class)
        # Children are stopped and sockets removed: skip the interpreter's slow teardown of torch.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.command == "bench":
        script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"bench_{args.name}.py"
        if not script.is_file():
            parser.error(f"no benchmark {args.name!r} ({script} does not exist)")
        sys.argv = [str(script), *args.args]
        runpy.run_path(str(script), run_name="__main__")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
