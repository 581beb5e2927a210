"""LiteLLM's Router side of the routing benchmark; runs in its own environment.

Started by ``bench/routing.py`` as ``.venv-bench-litellm/bin/python bench/routing_litellm.py N``
(the environment comes from ``bench/requirements-litellm.txt``; litellm never enters the
product's constraints). It builds one Router per strategy over N deployments of one model
group, warms each with mock completions through the Router itself (``mock_response``: no network,
but the success callbacks record latency and usage, so latency-based and usage-based-v2 pick
from real history), then answers one JSON line per request on stdin::

    {"strategy": "simple-shuffle", "picks": 200}  ->  {"thread_ns": [...], "wall_ns": [...]}

Each pick is ``Router.select(model, request_kwargs, messages=...)``, the call ``acompletion``
makes to choose a deployment, timed in thread CPU and wall time. Imports nothing of vidroute.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

# bench/ holds modules named like the standard library's (queue.py): never import from here.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price map
os.environ.setdefault("LITELLM_LOG", "ERROR")

import litellm  # noqa: E402 - after the environment switches above
from litellm import Router  # noqa: E402

STRATEGIES = (
    "simple-shuffle",
    "latency-based-routing",
    "usage-based-routing-v2",
    "cost-based-routing",
)
MESSAGES = [{"role": "user", "content": "a red fox running through fresh snow, golden hour"}]
WARMUP_CALLS = 256


def model_list(n: int) -> list[dict[str, Any]]:
    """N deployments of one group, each with its own price, rpm/tpm limits and endpoint."""
    return [
        {
            "model_name": "video",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_key": "sk-bench",
                "api_base": f"http://127.0.0.1:9/v{i}",
                "rpm": 10_000,
                "tpm": 10_000_000,
                "input_cost_per_token": 1e-7 * (1 + i % 7),
                "output_cost_per_token": 4e-7 * (1 + i % 5),
            },
            "model_info": {"id": f"deployment-{i}"},
        }
        for i in range(n)
    ]


async def warm(router: Router) -> None:
    """History for the stateful strategies: mock completions through the router's callbacks."""
    for _ in range(WARMUP_CALLS):
        await router.acompletion(model="video", messages=MESSAGES, mock_response="ok")
    await asyncio.sleep(0.5)  # let the async success callbacks finish writing their caches


async def picks(router: Router, count: int) -> dict[str, list[int]]:
    thread_ns, wall_ns = [], []
    for _ in range(count):
        w, t = time.perf_counter_ns(), time.thread_time_ns()
        await router.select("video", {}, messages=MESSAGES)
        thread_ns.append(time.thread_time_ns() - t)
        wall_ns.append(time.perf_counter_ns() - w)
    return {"thread_ns": thread_ns, "wall_ns": wall_ns}


async def main(n: int) -> None:
    routers = {s: Router(model_list=model_list(n), routing_strategy=s) for s in STRATEGIES}
    for router in routers.values():
        await warm(router)
        await picks(router, 20)  # first-call caches, as a long-running proxy would have them
    version = getattr(litellm, "__version__", "") or _dist_version()
    print(json.dumps({"ready": True, "litellm": version, "deployments": n}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        result = await picks(routers[request["strategy"]], int(request["picks"]))
        print(json.dumps(result), flush=True)


def _dist_version() -> str:
    from importlib.metadata import version

    return version("litellm")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 64))
