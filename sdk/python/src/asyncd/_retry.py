"""Opt-in retries of API calls, shared by :class:`asyncd.Client` and
:class:`asyncd.AsyncClient`."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional, TypeVar

from ._errors import is_retryable

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Sends an API call again after a retryable failure (:func:`asyncd.is_retryable`:
    the 503s ``store_unavailable``, ``kafka_unavailable``, ``auth_unavailable``, any 429
    (:class:`asyncd.RateLimited`), a proxy's 502/503/504, a connection that failed).
    Retrying a submit is safe: it carries its idempotency key, so a submit stored before
    its answer was lost answers the first task (``duplicate``) instead of enqueueing a
    second.

    ``max_attempts`` counts the first call. The wait before retry n is
    ``initial_backoff * 2**(n-1)`` seconds, capped at ``max_backoff``, drawn between half
    and all of it (equal jitter) — unless the answer carried ``Retry-After`` (a 429's, a
    503's), which replaces it, also capped at ``max_backoff`` so that a proxy asking for
    an hour cannot hold a call that long. ``on_retry(attempt, error, wait)`` is called
    before each wait; ``sleep``/``async_sleep`` wait (tests replace them)."""

    max_attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 5.0
    on_retry: Optional[Callable[[int, BaseException, float], None]] = None
    sleep: Callable[[float], None] = time.sleep
    async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def wait(self, attempt: int, err: BaseException) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) that raised ``err``."""
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            return min(float(retry_after), self.max_backoff)
        backoff = min(self.initial_backoff * (2 ** (attempt - 1)), self.max_backoff)
        return backoff / 2 + random.uniform(0, backoff / 2)

    def _give_up(self, attempt: int, err: BaseException) -> bool:
        return attempt >= self.max_attempts or not is_retryable(err)

    def run(self, call: Callable[[], T]) -> T:
        attempt = 1
        while True:
            try:
                return call()
            except Exception as err:  # noqa: BLE001 - only retryable ones are retried
                if self._give_up(attempt, err):
                    raise
                wait = self.wait(attempt, err)
                if self.on_retry is not None:
                    self.on_retry(attempt, err, wait)
                self.sleep(wait)
                attempt += 1

    async def run_async(self, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 1
        while True:
            try:
                return await call()
            except Exception as err:  # noqa: BLE001 - only retryable ones are retried
                if self._give_up(attempt, err):
                    raise
                wait = self.wait(attempt, err)
                if self.on_retry is not None:
                    self.on_retry(attempt, err, wait)
                await self.async_sleep(wait)
                attempt += 1
