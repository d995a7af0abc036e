"""Where an embedded server runs: its own event loop in a thread, the lifecycle on it, and
the one way calls cross to it and the one way it ends.

A stop ends everything on the loop, not only the models: the lifecycle closes (requests
under way may finish within ``exit_timeout_secs``, streams included), then every task
still there is cancelled, so no caller waits on a loop that has gone; a caller whose call
was cut short gets EmbeddedError saying so. The stop runs on the loop's own thread, so a
caller interrupted while it waits (Ctrl-C) leaves it to finish there. ``Runtime`` holds
nothing of the ``Server`` object, so a server dropped without ``stop()`` is stopped by a
finalizer (at the latest, at interpreter exit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # its exit hook registered before ours (see _at_exit)
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from reposerve.errors import EmbeddedError
from reposerve.server import Server as Lifecycle
from reposerve.settings import Settings

R = TypeVar("R")

NOT_STARTED = "this server is not started: call start() first"
STOPPED = "this server has stopped"
_started: weakref.WeakSet[Runtime] = weakref.WeakSet()  # runtimes a stop may still be owed


def _at_exit() -> None:
    """Stop every runtime left running, while threads can still be used: threading runs
    these hooks last registered first, before concurrent.futures' own (registered at its
    import, above) refuses new work to every thread pool, which a stop needs (an
    instance's exit is awaited in one). A finalizer alone runs after that hook."""
    for runtime in list(_started):
        runtime.stop()


# Private to threading, and there since Python 3.9; where it is not, the finalizers still
# stop a server at exit, with errors from its thread pools.
getattr(threading, "_register_atexit", lambda hook: None)(_at_exit)


class Runtime:
    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=_run, args=(self.loop,), name="reposerve")
        self.thread.daemon = True  # a host that exits without stop() is not held up here
        self.lifecycle: Lifecycle | None = None
        self._lock = threading.Lock()  # the flags below, and what is sent to the loop
        self._stopping = False  # no new calls; streams under way still read
        self._closed = False  # nothing crosses any more: the loop is ending
        self._stopped = threading.Event()

    def start(self, settings: Settings) -> None:
        """The loop's thread and the lifecycle on it (its fronts; the models' loading)."""
        _started.add(self)
        self.thread.start()
        self.call(self._open(settings), new=True)

    async def _open(self, settings: Settings) -> None:
        self.lifecycle = lifecycle = Lifecycle(settings, embedded=True)
        await lifecycle.open()  # what it opened is closed by the stop that follows a failure

    def running(self) -> Lifecycle:
        if self._stopping:
            raise EmbeddedError(STOPPED)
        if self.lifecycle is None:
            raise EmbeddedError(NOT_STARTED)
        return self.lifecycle

    # -- crossing to the loop -------------------------------------------------------------

    def submit(self, work: Coroutine[Any, Any, R], new: bool) -> concurrent.futures.Future[R]:
        """``work`` sent to the loop; ``new``: a call of its own (refused once the stop has
        begun), else the next step of a stream under way (until the loop ends)."""
        if threading.current_thread() is self.thread:
            work.close()
            raise EmbeddedError(
                "called from the server's own thread (a model's code, or a callback of the "
                "server): a blocking call there would wait for itself; use the async calls"
            )
        with self._lock:
            if self._closed or (new and self._stopping):
                work.close()
                raise EmbeddedError(STOPPED)
            return asyncio.run_coroutine_threadsafe(work, self.loop)

    def call(
        self, work: Coroutine[Any, Any, R], new: bool = True, timeout: float | None = None
    ) -> R:
        future = self.submit(work, new)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            raise EmbeddedError(f"{STOPPED} before it answered") from None
        except TimeoutError:
            if future.done():  # raised by the work itself
                raise
            future.cancel()
            raise
        except BaseException:
            future.cancel()  # an interrupted caller: its request goes too
            raise

    async def wait(self, work: Coroutine[Any, Any, R], new: bool = True) -> R:
        try:
            return await asyncio.wrap_future(self.submit(work, new))
        except asyncio.CancelledError:
            if self._closed and not _cancelling():
                raise EmbeddedError(f"{STOPPED} before it answered") from None
            raise

    # -- the end ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the lifecycle and everything else on the loop, then the loop (once; a
        second call waits for the first)."""
        with self._lock:
            begun = self._stopping
            self._stopping = True
        if not self.thread.is_alive():
            if not self.loop.is_closed():
                self.loop.close()
            return
        if not begun:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        self._stopped.wait()
        self.thread.join()

    async def _shutdown(self) -> None:
        try:
            if self.lifecycle is not None:
                await self.lifecycle.close()
        finally:
            with self._lock:
                self._closed = True
            await asyncio.sleep(0)  # calls sent before the flag became tasks meanwhile
            current = asyncio.current_task()
            left = [task for task in asyncio.all_tasks() if task is not current]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()
            self._stopped.set()
            self.loop.stop()


def _run(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _cancelling() -> bool:
    """Whether the awaiting task itself is being cancelled (not its call by a stop)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
