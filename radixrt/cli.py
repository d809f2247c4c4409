"""`radixrt serve ...` (flags derived from ServerConfig, SGLang's names),
`radixrt cache-tree --url ...` (what a server's radix cache holds, drawn in the terminal) and
`radixrt bench <name> ...`."""

from __future__ import annotations

import argparse
import os
import pathlib
import runpy
import sys

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.config_checks import SECRET_ENVS
from radixrt.runtime.core.cache_view import DEFAULT_MAX_DEPTH, DEFAULT_MAX_NODES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixrt", description="radixrt: structured-generation LLM runtime"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="start the HTTP server (SGLang-native and OpenAI-compatible API)"
    )
    ServerConfig.add_cli_args(serve)
    # "module:Class" with the Scheduler interface; tests use it to serve without a model
    serve.add_argument("--scheduler-class", default=None, help=argparse.SUPPRESS)
    tree = sub.add_parser("cache-tree", help="print what a running server's radix cache holds")
    tree.add_argument(
        "--url", default="http://127.0.0.1:30000", help="the server (default %(default)s)"
    )
    tree.add_argument(
        "--admin-api-key",
        "--api-key",
        dest="api_key",
        default=os.environ.get("RADIXRT_ADMIN_API_KEY"),
        help="the server's --admin-api-key (/cache_tree is an admin route; default: "
        "$RADIXRT_ADMIN_API_KEY)",
    )
    tree.add_argument(
        "--max-depth",
        type=int,
        default=DEFAULT_MAX_DEPTH,
        help="levels shown (default %(default)s)",
    )
    tree.add_argument(
        "--max-nodes", type=int, default=DEFAULT_MAX_NODES, help="nodes shown (default %(default)s)"
    )
    tree.add_argument(
        "--json", action="store_true", help="print the /cache_tree JSON instead of the drawing"
    )
    bench = sub.add_parser(
        "bench", help="run a benchmark from benchmarks/ (e.g. `radixrt bench serving --help`)"
    )
    bench.add_argument("name", help="benchmark name: benchmarks/bench_<name>.py")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    return parser


def print_cache_tree(args: argparse.Namespace) -> int:
    import json

    import requests

    from radixrt.runtime.cache_tree_text import render_text

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        r = requests.get(
            args.url.rstrip("/") + "/cache_tree",
            headers=headers,
            timeout=30,
            params={"max_depth": args.max_depth, "max_nodes": args.max_nodes},
        )
    except requests.RequestException as e:
        print(f"radixrt cache-tree: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        print(
            f"radixrt cache-tree: {args.url} answered {r.status_code}: {message}", file=sys.stderr
        )
        return 1
    print(json.dumps(r.json(), indent=1) if args.json else render_text(r.json()))
    return 0


def take_secret_envs(args: argparse.Namespace) -> None:
    """The keys from their variables (kept out of argv, which every local user sees) where no flag
    gave them, then out of this process's environment: the processes it starts (grammar compile
    workers, tensor-parallel workers, sglang-router) inherit the environment, and none of them
    needs a key; a launcher hands each replica its own (dp_launch.replica_env)."""
    for name, env in SECRET_ENVS.items():
        if getattr(args, name, None) is None and os.environ.get(env):
            setattr(args, name, os.environ[env])
        os.environ.pop(env, None)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        take_secret_envs(args)
        try:
            config = ServerConfig.from_cli_args(args)
        except ValueError as e:
            parser.error(str(e))
        if config.node_rank > 0:  # tensor parallel ranks of another machine: no HTTP, no scheduler
            from radixrt.runtime.model.tp import run_headless_node

            code = run_headless_node(config)
        elif config.pd is not None:
            from radixrt.runtime.serving.launch.pd_launch import launch_pd

            code = launch_pd(config)
        elif config.dp_size > 1:
            from radixrt.runtime.serving.launch.dp_launch import launch_dp

            code = launch_dp(config)
        else:
            from radixrt.runtime.serving.launch.launch import launch_server

            code = launch_server(config, args.scheduler_class)
        # Children are stopped and sockets removed: skip the interpreter's slow teardown of torch.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.command == "cache-tree":
        return print_cache_tree(args)
    if args.command == "bench":
        script = (
            pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"bench_{args.name}.py"
        )
        if not script.is_file():
            parser.error(f"no benchmark {args.name!r} ({script} does not exist)")
        sys.argv = [str(script), *args.args]
        runpy.run_path(str(script), run_name="__main__")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
