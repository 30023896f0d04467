"""Start the conversation gateway with a bench agent whose model is a vendor's HTTP API.

    python bench/gateway_vendor_serve.py --provider anthropic|gemini|openai --port P \
        --upstream-port U [--gateway BIN] [--max-connections 4096]

The agent's ``[model]`` is the ``--provider`` adapter (model "bench", key from
BENCH_UPSTREAM_KEY, set here to a dummy: the bench upstreams check none) at the bench
upstream on port U, so every conversation step is one streamed request over HTTP, as in a
real deployment: ``bench/upstream_vendors.py`` for ``anthropic`` and ``gemini``,
``.bench/servers/upstream_openai.py`` for ``openai`` (whose base URL ends in ``/v1``; the
other adapters add their own paths). The targets ``gateway-anthropic`` and
``gateway-gemini`` of ``bench/targets_vendors.json`` start it. The model's
``max_connections`` is raised from 1000 to --max-connections so that 2,000 concurrent
conversations do not wait for a pooled connection. Every client message must follow a
``session.start`` (the harness's --hello does it).

BIN defaults to $GATEWAY_BIN, else the ``gateway`` script beside this interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

BASE_PATHS = {"openai": "/v1", "anthropic": "", "gemini": ""}
"""What each adapter's base URL adds to the server's root (the adapter adds the rest)."""


def agent_toml(provider: str, upstream_port: int, max_connections: int) -> str:
    base_url = f"http://127.0.0.1:{upstream_port}{BASE_PATHS[provider]}"
    return f'''name = "bench-{provider}"
instructions = "bench"

[model]
provider = "{provider}"
model = "bench"
base_url = "{base_url}"
api_key_env = "BENCH_UPSTREAM_KEY"
max_connections = {max_connections}
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--provider", choices=sorted(BASE_PATHS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument(
        "--gateway",
        default=os.environ.get("GATEWAY_BIN")
        or os.path.join(os.path.dirname(sys.executable), "gateway"),
    )
    parser.add_argument("--max-connections", type=int, default=4096)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix=f"gwbench-{args.provider}-")
    agent = os.path.join(folder, "agent.toml")
    with open(agent, "w") as file:
        file.write(agent_toml(args.provider, args.upstream_port, args.max_connections))
    env = dict(
        os.environ,
        GATEWAY_LOG_LEVEL=os.environ.get("GATEWAY_LOG_LEVEL", "warning"),
        BENCH_UPSTREAM_KEY="bench-not-a-key",
    )
    command = ["serve", "--host", "127.0.0.1", "--port", str(args.port), "--agent", agent]
    # the harness opens connections well before it speaks on them
    command += ["--first-message-timeout", "600"]
    os.execve(args.gateway, [args.gateway, *command], env)


if __name__ == "__main__":
    main()
