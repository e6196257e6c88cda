"""Concurrent submits share calls: while a client's submit calls are all in flight,
further submits queue and go together in the next free call, one ``POST
/v1/tasks:batch`` whose items the API judges one by one (the Go SDK's coalesce.go)."""

from __future__ import annotations

import asyncio
import copy
import threading
import weakref
from collections import deque
from typing import Any, Awaitable, Callable, Deque, List, Optional, Set, Tuple

from ._errors import TransportError

DEFAULT_SUBMIT_CALLS = 4
"""How many submit calls a client has in flight at once before further concurrent submits
wait and share the next call (``submit_calls=``)."""

# A shared call carries at most this many tasks and, past its first task, at most
# MAX_BYTES of them: the API's batch limits are 1000 items and 16 MiB by default, and an
# operator may lower the byte limit to the single-task body limit.
MAX_TASKS = 1000
MAX_BYTES = 1 << 20

#: A submit's answer: its result, or the error it raises.
Outcome = Tuple[Any, Optional[BaseException]]


def failed_all(err: BaseException, n: int) -> List[Outcome]:
    """``err`` for each of ``n`` submits. Each but the first gets a copy: the submits
    raise it in their own threads or tasks, and raising one exception object in several
    at once interleaves their tracebacks on it."""
    return [(None, err if i == 0 else _copy_error(err)) for i in range(n)]


def _copy_error(err: BaseException) -> BaseException:
    try:
        mine = copy.copy(err)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is shared
        return err
    mine.__cause__, mine.__suppress_context__ = err.__cause__, err.__suppress_context__
    mine.__traceback__ = err.__traceback__
    return mine


def _take(queue: "Deque[Any]") -> List[Any]:
    """The next call's submits, from the head of ``queue``."""
    call: List[Any] = []
    size = 0
    while queue and len(call) < MAX_TASKS:
        size += len(queue[0].raw) + 1
        if call and size > MAX_BYTES:
            break
        call.append(queue.popleft())
    return call


class _Waiting:
    __slots__ = ("raw", "cond", "done", "sending", "result", "error")

    def __init__(self, raw: bytes, cond: threading.Condition) -> None:
        self.raw = raw
        self.cond = cond
        self.done = False
        # Whether this submit's thread holds a sender role (one of the max_calls).
        self.sending = False
        self.result: Any = None
        self.error: Optional[BaseException] = None


class SubmitQueue:
    """The sync :class:`asyncd.Client`'s shared submit calls, made by the submitting
    threads themselves (no thread of its own).

    At most ``max_calls`` threads hold a sender role; only they make calls. A submit that
    finds a role free takes it, and its first call is its own task alone, since nothing
    else is queued while a role is free (bar submits whose threads were just handed a
    role and have not woken yet: then it carries them too). A sender makes calls from the head of the queue
    only while its own submit is unanswered, so no thread sends for others for longer
    than its own wait plus one call; once answered, it hands its role to the first queued
    submit's thread (which wakes and sends the next call, its own task included), or gives
    the role up if nothing is queued. So there are never more than ``max_calls`` calls in
    flight, and nothing stays queued without a sender."""

    def __init__(self, max_calls: int, answer: Callable[[List[bytes]], List[Outcome]]) -> None:
        self.max_calls = max_calls
        self._answer = answer
        self._lock = threading.Lock()
        self._queue: Deque[_Waiting] = deque()  # bounded by the threads blocked in submit
        self._senders = 0

    def submit(self, raw: bytes) -> Any:
        me = _Waiting(raw, threading.Condition(self._lock))
        with self._lock:
            self._queue.append(me)
            if self._senders < self.max_calls:
                self._senders += 1
                me.sending = True
        try:
            while True:
                with self._lock:
                    while not (me.done or me.sending):
                        me.cond.wait()
                    if not me.sending:
                        break
                self._send(me)
        except BaseException:
            # An interrupted wait (KeyboardInterrupt): a task still queued is not sent,
            # and a sender role this thread held goes on to another.
            with self._lock:
                try:
                    self._queue.remove(me)
                except ValueError:
                    pass
                if me.sending:
                    me.sending = False
                    self._pass_role()
            raise
        if me.error is not None:
            raise me.error
        return me.result

    def _send(self, me: _Waiting) -> None:
        while True:
            with self._lock:
                if me.done or not self._queue:
                    me.sending = False
                    self._pass_role()
                    return
                call = _take(self._queue)
            try:
                outcomes = self._answer([q.raw for q in call])
            except BaseException as e:
                # Interrupted in this thread: the others in the call must not wait forever.
                # Their tasks may be stored; their idempotency keys make a retry safe.
                with self._lock:
                    for q in call:
                        if not q.done:
                            self._settle(q, (None, TransportError(f"the call carrying this submit was interrupted: {e!r}")))
                raise
            with self._lock:
                for q, outcome in zip(call, outcomes):
                    self._settle(q, outcome)

    @staticmethod
    def _settle(q: _Waiting, outcome: Outcome) -> None:
        q.result, q.error = outcome
        q.done = True
        q.cond.notify()

    def _pass_role(self) -> None:
        """Hands a sender role to the first queued submit whose thread holds none, or
        gives it up; with the lock held."""
        for q in self._queue:
            if not q.sending:
                q.sending = True
                q.cond.notify()
                return
        # Nothing queued, or every queued submit's thread already holds a role and will
        # take from the queue when it wakes.
        self._senders -= 1

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def senders(self) -> int:
        with self._lock:
            return self._senders


class _Pending:
    __slots__ = ("raw", "future")

    def __init__(self, raw: bytes, future: "asyncio.Future[Any]") -> None:
        self.raw = raw
        self.future = future


class _LoopQueue:
    def __init__(self) -> None:
        self.queue: Deque[_Pending] = deque()
        self.senders = 0
        # The sender tasks, kept referenced while they run (the loop holds them weakly).
        self.tasks: Set["asyncio.Task[None]"] = set()


class AsyncSubmitQueue:
    """The :class:`asyncd.AsyncClient`'s shared submit calls, as in the Go SDK: a submit
    that finds fewer than ``max_calls`` sender tasks starts one; each sender makes calls
    from the head of the queue until it is empty, then ends. A submit cancelled while
    queued (``asyncio.wait_for``, a cancelled task) is removed and never sent.

    Each event loop has its own queue and senders (an asyncio future belongs to its
    loop), so a client shared by several loops has ``max_calls`` calls in flight per
    loop."""

    def __init__(self, max_calls: int, answer: Callable[[List[bytes]], Awaitable[List[Outcome]]]) -> None:
        self.max_calls = max_calls
        self._answer = answer
        self._loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue]" = weakref.WeakKeyDictionary()

    def _here(self) -> _LoopQueue:
        loop = asyncio.get_running_loop()
        q = self._loops.get(loop)
        if q is None:
            q = self._loops[loop] = _LoopQueue()
        return q

    async def submit(self, raw: bytes) -> Any:
        lq = self._here()
        loop = asyncio.get_running_loop()
        me = _Pending(raw, loop.create_future())
        lq.queue.append(me)
        if lq.senders < self.max_calls:
            lq.senders += 1
            task = loop.create_task(self._send(lq))
            lq.tasks.add(task)
            task.add_done_callback(lq.tasks.discard)
        try:
            return await me.future
        except asyncio.CancelledError:
            try:
                lq.queue.remove(me)
            except ValueError:
                # Already taken into a call: the task may still be stored, as when a lone
                # call is cancelled after it was sent; its idempotency key makes a retry safe.
                pass
            raise

    async def _send(self, lq: _LoopQueue) -> None:
        try:
            while lq.queue:
                call = [p for p in _take(lq.queue) if not p.future.done()]
                if call:
                    await self._send_call(call)
        finally:
            lq.senders -= 1

    async def _send_call(self, call: List[_Pending]) -> None:
        try:
            outcomes = await self._answer([p.raw for p in call])
        except BaseException:
            # The sender was cancelled (its loop is closing): so are the submits it carried.
            for p in call:
                if not p.future.done():
                    p.future.cancel()
            raise
        for p, (result, err) in zip(call, outcomes):
            if p.future.done():  # its submit gave up while the call was in flight
                continue
            if err is not None:
                p.future.set_exception(err)
            else:
                p.future.set_result(result)

    def queued(self) -> int:
        return len(self._here().queue)

    def senders(self) -> int:
        return self._here().senders
