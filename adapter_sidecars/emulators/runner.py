"""Run an emulator outside the caller's event loop: on a thread, or as a standalone process.

`EmulatorThread` serves sync pytest code; `main` backs ``python -m adapter_sidecars.emulators.X``
and builds the emulator's frozen config dataclass from ``--flag value`` options.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import typing
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from adapter_sidecars.emulators.core import Emulator, EmulatorConfig

T = TypeVar("T")
C = TypeVar("C", bound=EmulatorConfig)


class EmulatorThread:
    """Owns an event loop on a daemon thread and serves `emulator` on it."""

    def __init__(self, emulator: Emulator, host: str = "127.0.0.1", port: int = 0) -> None:
        self.emulator = emulator
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        self.url = self._run(self.emulator.start(self._host, self._port))
        return self.url

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._run(self.emulator.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> EmulatorThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a (sync) emulator method on the loop thread and return its result."""

        async def invoke() -> T:
            return fn(*args)

        return self._run(invoke())

    def add_faults(self, rules: Any) -> list[dict[str, Any]]:
        return self.call(self.emulator.add_faults, rules)

    def clear_faults(self) -> None:
        self.call(self.emulator.clear_faults)

    def truth(self) -> list[dict[str, Any]]:
        return self.call(self.emulator.truth)

    def reset(self) -> None:
        self.call(self.emulator.reset)

    def add_usage(self, charge: dict[str, Any]) -> dict[str, Any]:
        return self.call(self.emulator.add_usage, charge)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)


def config_parser(config_cls: type[EmulatorConfig], prog: str) -> argparse.ArgumentParser:
    """One ``--field-name`` option per config field; mappings/tuples take JSON."""
    parser = argparse.ArgumentParser(prog=prog, description=config_cls.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        hint = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        origin = typing.get_origin(hint)
        if origin is frozenset:
            parser.add_argument(flag, type=_names, default=None, help="a,b or a JSON list")
        elif hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif hint in (int, float, str):
            parser.add_argument(flag, type=hint, default=None)
        elif origin is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(hint), default=None)
        elif _is_optional(hint):
            inner = next(a for a in typing.get_args(hint) if a is not type(None))
            parser.add_argument(flag, type=inner, default=None)
        else:
            parser.add_argument(flag, type=json.loads, default=None, help="JSON value")
    return parser


def _names(text: str) -> frozenset[str]:
    """``a,b`` or ``["a", "b"]`` -> frozenset; an empty string is the empty set."""
    if text.lstrip().startswith("["):
        return frozenset(str(n) for n in json.loads(text))
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def _is_optional(hint: Any) -> bool:
    args = typing.get_args(hint)
    return type(None) in args and len(args) == 2 and args[0] in (int, float, str)


def config_from_args(config_cls: type[C], args: argparse.Namespace) -> C:
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(config_cls)
        if getattr(args, f.name, None) is not None
    }
    return config_cls(**values)


def main(
    emulator_cls: Callable[[C], Emulator], config_cls: type[C], argv: Sequence[str] | None = None
) -> int:
    """Serve until SIGTERM/SIGINT; a second signal exits at once."""
    prog = f"python -m adapter_sidecars.emulators.{getattr(emulator_cls, 'name', 'emulator')}"
    args = config_parser(config_cls, prog).parse_args(argv)
    emulator = emulator_cls(config_from_args(config_cls, args))
    asyncio.run(_serve(emulator, args.host, args.port))
    return 0


async def _serve(emulator: Emulator, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            os._exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    url = await emulator.start(host, port)
    print(f"{emulator.name} emulator listening on {url}", flush=True)
    await stop.wait()
    await emulator.stop()
    print(f"{emulator.name} emulator stopped", file=sys.stderr, flush=True)
