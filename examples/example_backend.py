"""What every example shares: `--url URL` sends its programs to a running `radixrt serve`;
without it they run on the in-process Engine (radixrt's default backend)."""

from __future__ import annotations

import argparse

import radixrt as sgl


def parse_args(doc: str, extra=None) -> argparse.Namespace:
    """Parse the example's flags (`extra(parser)` may add its own) and pick the backend."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="a running `radixrt serve` (default: in-process Engine)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.url:
        sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    return args
