#!/usr/bin/env python
"""Send prompts to a running trtspec Triton endpoint (`trtspec serve REPO`) and print the text and the
acceptance metrics. A thin command line over trtspec.validate.triton_client.TritonClient (the one Triton client).

    python tools/client.py --url 127.0.0.1:8001 --protocol grpc --stream --max-tokens 64 --num-draft-tokens 4 \\
        "def fibonacci(n):"
    python tools/client.py --url 127.0.0.1:8000 --protocol http --temperature 0.8 --top-p 0.95 --seed 7 \\
        "import os" "class Point:"

Exit status: 0 when every prompt was answered, 2 when the server refused a request or could not be reached.
"""

from __future__ import annotations

import argparse
import socket
import sys

from trtspec.core.errors import ServerError, TrtspecError
from trtspec.core.lookup import PROPOSERS
from trtspec.validate.triton_client import EndpointResponse, TritonClient


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "prompts", nargs="+", metavar="PROMPT", help="one or more prompts, sent one after another"
    )
    parser.add_argument(
        "--url", default="127.0.0.1:8001", help="HOST:PORT of the gRPC endpoint, or http://HOST:PORT"
    )
    parser.add_argument(
        "--protocol",
        choices=["auto", "grpc", "http"],
        default="auto",
        help="auto: http for http:// URLs, else grpc",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="entry model [default: tensorrt_llm_bls, else upstream's LLM-API tensorrt_llm]",
    )
    parser.add_argument("--stream", action="store_true", help="stream the answer round by round (decoupled)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument(
        "--num-draft-tokens", type=int, default=None, help="draft tokens per round (K) [default: the repo's]"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 or absent: greedy; samples only beside --top-k or --top-p (upstream's rule; --top-p 1: all tokens)",
    )
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=seed, default=None, help="a sampled request's seed (0 to 2**64 - 1)")
    parser.add_argument(
        "--proposer",
        choices=PROPOSERS,
        default=None,
        help="who proposes draft tokens [default: the repo's]",
    )
    parser.add_argument("--no-metrics", action="store_true", help="print only the generated text")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one answer")
    return parser.parse_args(argv)


def seed(text: str) -> int:
    """--seed: Triton's seed input is UINT64, where -1 would wrap to 2**64 - 1 in silence and 2**64 does not fit."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; a seed is 0 or more")
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"{value} does not fit Triton's UINT64 seed; a seed is below 2**64")
    return value


def sampling(args: argparse.Namespace) -> dict:
    """The sampling (and proposer) inputs given on the command line (absent ones keep the server's defaults)."""
    fields = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    fields["proposer"] = args.proposer
    return {name: value for name, value in fields.items() if value is not None}


def metrics_line(response: EndpointResponse) -> str:
    """One line: acceptance (accepted / drafted), time to the first text piece, total time, pieces."""
    m = response.metrics
    drafted, accepted = int(m.get("total_draft_tokens", 0)), int(m.get("total_accepted_draft_tokens", 0))
    parts = [
        f"acceptance {m.get('acceptance_rate', 0.0):.2f} ({accepted}/{drafted} draft tokens accepted)"
        if drafted
        else "acceptance n/a (no draft tokens)"
    ]
    looked_up = int(m.get("ngram_draft_tokens", 0))
    if looked_up:
        parts.append(f"prompt lookup {int(m.get('ngram_accepted_draft_tokens', 0))}/{looked_up} of them")
    if response.pieces:
        parts.append(f"first text {response.pieces[0][0] * 1000:.0f} ms")
    parts.append(f"total {response.elapsed_s * 1000:.0f} ms")
    parts.append(f"{len(response.pieces)} piece(s)")
    return "  ".join(parts)


def check_reachable(client: TritonClient) -> None:
    """Fail in one clear line when nothing listens at the address (gRPC would report a broken stream)."""
    host, _, port = client.address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as err:
        raise ServerError(
            f"cannot reach Triton at {client.address} ({err}); start it with `trtspec serve REPO` or fix --url"
        ) from None


def run(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = parse_args(argv)
    client = TritonClient(args.url, args.protocol, args.model, timeout_s=args.timeout)
    check_reachable(client)
    for i, prompt in enumerate(args.prompts):
        if len(args.prompts) > 1:
            print(f"--- [{i + 1}/{len(args.prompts)}]", file=out)
        response = client.generate(
            prompt, args.max_tokens, args.num_draft_tokens, args.stream, **sampling(args)
        )
        print(prompt + response.text, file=out)
        if not args.no_metrics:
            print(f"[{metrics_line(response)}]", file=out)
    return 0


def main() -> None:
    try:
        sys.exit(run())
    except TrtspecError as err:  # expected failures: one line, no traceback
        print(f"Error: {err.message}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
