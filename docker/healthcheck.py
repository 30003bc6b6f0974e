#!/usr/bin/env python3
"""Container health check: exit 0 when Triton answers ready on /v2/health/ready, else 1 (standard library only).

The port is TRTSPEC_HTTP_PORT (default 8000, the container's fixed HTTP port); the check always asks the
loopback address, which the server answers whether it binds 0.0.0.0 or 127.0.0.1.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

READY_PATH = "/v2/health/ready"


def ready_url(environ: dict[str, str]) -> str:
    return f"http://127.0.0.1:{environ.get('TRTSPEC_HTTP_PORT', '8000')}{READY_PATH}"


def is_ready(url: str, timeout_s: float = 4.0) -> bool:
    """True when the server answers HTTP 200: every model of the repository is loaded and ready."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    url = ready_url(dict(os.environ))
    if is_ready(url):
        return 0
    print(f"not ready: {url}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
