"""The worker manager: runs a program's nodes as processes or threads and supervises them.

One supervisor thread per launched program forks the node processes (so that
their parent-death signal is tied to a thread that lives as long as they do),
then waits in ``poll`` on: each process's pidfd (exit), its stdout/stderr pipes
(forwarded line by line with a ``[label/i]`` prefix), its error pipe (the
traceback it died with), and one request pipe on which nodes ask for a stop, the
signal handlers report Ctrl+C, and thread nodes report that they ended.

Stopping closes the stop pipe (every node's watcher thread sees end-of-file and
triggers its stop handlers), a second later closes the rings of data and courier
nodes (callers still blocked on them wake with ``Closed``), waits the termination notice and then SIGKILLs
the process group of every node still alive. The first failure (an exception, a
non-zero exit, a death by signal) that happens before a stop began is printed as
``Error in node 'label/i'`` with its traceback, stops the program, and is raised
by ``wait()``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterable

from shmpad import context
from shmpad.errors import NodeFailed
from shmpad.launch.node_run import NodeRun, launcher_fds, start_process, start_thread
from shmpad.launch.output import say
from shmpad.launch.resources import PythonProcess
from shmpad.nodes.base import Node
from shmpad.shm import janitor
from shmpad.top.registry import PHASE_ENDED, PHASE_STOPPING, Registry

__all__ = ["WorkerManager"]

# How long after a stop begins the rings of data and courier nodes are closed (waking
# whoever still blocks on them): time for stop handlers to send their last messages.
CLOSE_GRACE_S = 1.0


class WorkerManager:
    """Runs and supervises the nodes of one launched program (returned by ``launch``)."""

    def __init__(
        self,
        program: str,
        launch_type: str,
        processes: bool,
        termination_notice_secs: float,
        registry: Registry | None = None,
    ):
        self.program = program
        self.registry = registry
        self.launch_type = launch_type
        self._processes = processes
        self._notice = termination_notice_secs
        self._workers: list[NodeRun] = []
        self._nodes: list[Node] = []
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        self._failed_worker: NodeRun | None = None
        self._failure_raised = False
        self._stopping = False
        self._interrupts = 0
        self._kill_at: float | None = None
        self._close_at: float | None = None
        self._finished = False
        self._ending = False  # every node has ended: on_end hooks run now
        self._hooks_run = False
        self._stop_r, self._stop_w = os.pipe()
        self._req_r, self._req_w = os.pipe()
        launcher_fds.update((self._stop_w, self._req_r))
        # reentrant: the signal handler pokes too, and may run inside a poke of its thread
        self._poke_lock = threading.RLock()
        os.set_blocking(self._req_r, False)
        self._stopper = context.StopController(on_request=self._request_stop)
        self._ctx = context.NodeContext(program, launch_type, self._stopper)
        self._extra = {} if registry is None else {"registry": registry}
        self._ctx.extra.update(self._extra)
        self._supervisor: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._old_handlers: dict[int, Any] = {}
        self._end_hooks: list[Callable[[], None]] = []

    # -- setting up --------------------------------------------------------------------

    def add(self, label: str, index: int, node: Node, resources: PythonProcess | None) -> None:
        self._workers.append(NodeRun(label, index, node, resources, row=len(self._workers)))

    def on_end(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` once every node has ended, before ``wait()`` returns (at once
        if that has happened already). The live view stops itself so."""
        with self._cond:
            if not self._ending:
                self._end_hooks.append(hook)
                return
        hook()

    def track(self, nodes: Iterable[Node]) -> None:
        """Nodes whose ``on_stop``/``release`` the manager calls (all of the program's),
        and whose ``free`` runs when the manager is garbage or at exit."""
        self._nodes.extend(nodes)

    def start(self) -> None:
        context.set_process_context(self._ctx)
        self._install_signal_handlers()
        self._supervisor = threading.Thread(target=self._supervise, name=f"shmpad-launcher-{self.program}", daemon=True)
        self._supervisor.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    # -- public API --------------------------------------------------------------------

    def wait(
        self, labels: Iterable[str] | None = None, raise_error: bool = True, return_on_first_completed: bool = False
    ) -> None:
        """Block until the nodes of ``labels`` have ended (default: all of them, and the launcher
        has finished with the program), or with ``return_on_first_completed`` until one of them has. If any node failed (and
        ``raise_error``), waits until the program has stopped and raises that failure."""
        if isinstance(labels, str):
            labels = [labels]
        wanted = None if labels is None else set(labels)
        if wanted is not None:
            known = {w.label for w in self._workers}
            unknown = wanted - known
            if unknown:
                raise ValueError(f"no running nodes labelled {sorted(unknown)}; labels with nodes: {sorted(known)}")
        if self._finished and threading.current_thread() is threading.main_thread():
            self._restore_signal_handlers()
        with self._cond:
            while True:
                if raise_error and self._failure is not None and self._finished:
                    self._raise_failure()
                mine = [w for w in self._workers if wanted is None or w.label in wanted]
                if self._finished:
                    return
                if self._failure is None or not raise_error:
                    # (after a failure, wait for the stop to finish, then raise it)
                    # the whole program returns above, once finished: its on_end hooks have run, the
                    # live view has stopped and the launching process is no longer in its context
                    if wanted is not None and all(w.ended() for w in mine):
                        return
                    if return_on_first_completed and any(w.ended() for w in mine):
                        return
                # a timed wait: the main thread runs Python signal handlers (Ctrl+C)
                # only between waits
                self._cond.wait(0.1)

    def stop(self) -> None:
        """Begin stopping the program (returns at once)."""
        self._request_stop()

    def stop_and_wait(self) -> None:
        """Stop the program and wait until every node has ended (or was killed)."""
        self._request_stop()
        self.wait(raise_error=False)

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        return self._stopper.event.wait(timeout)

    def stop_event(self) -> threading.Event:
        return self._stopper.event

    def cleanup_after_test(self, test_case: Any = None) -> None:
        """Stop, wait, then raise the first failure if there was one (and ``wait()`` did
        not raise it already)."""
        self.stop_and_wait()
        self._raise_failure()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def exit_codes(self) -> dict[str, int | None]:
        """``label/i`` -> exit code of each ended process node (None: still running)."""
        return {w.name: w.exit_code for w in self._workers}

    def pids(self) -> dict[str, int]:
        return {w.name: w.pid for w in self._workers if w.pid is not None}

    def _raise_failure(self) -> None:
        """Raise the failure, if there is one that no caller got yet: a failure reaches
        the user once (``wait()`` raised it: the test's cleanup and exit do not again)."""
        if self._failure is None or self._failure_raised:
            return
        self._failure_raised = True
        atexit.unregister(self._wait_at_exit)  # the caller has it: exit need not report it
        raise self._failure

    def _wait_at_exit(self) -> None:
        """Registered with atexit by the local launch types: the launcher's interpreter
        waits for the program and exits non-zero if it failed."""
        try:
            self.wait()
        except BaseException:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    # -- supervision -------------------------------------------------------------------

    def _request_stop(self) -> None:
        self._poke(b"s")

    def _poke(self, what: bytes) -> None:
        """Wake the supervisor with a request (a no-op once the program is over)."""
        with self._poke_lock:
            if self._req_w >= 0:
                try:
                    os.write(self._req_w, what)
                except OSError:
                    pass

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may; Ctrl+C then raises KeyboardInterrupt there as usual

        def on_signal(signum, frame):
            if self._finished:  # the program is over: behave as before it started
                old = self._old_handlers.get(signum)
                self._restore_signal_handlers()
                if callable(old):
                    old(signum, frame)
                return
            self._poke(b"i" if signum == signal.SIGINT else b"s")

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()

    def _supervise(self) -> None:
        # Signals go to a thread that does not block them; Python runs handlers only in
        # the main thread, and only when that thread wakes: keep them off this one.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        poller = select.poll()
        self._poller = poller
        self._by_fd: dict[int, NodeRun] = {}
        try:
            poller.register(self._req_r, select.POLLIN)
            for w in self._workers:
                self._start_worker(w)
        except BaseException as e:
            self._start_error = e
            for w in self._workers:
                if w.pid is None and w.thread is None:
                    w.done = w.reported = True  # never started: nothing to wait for
            self._begin_stop()
        finally:
            self._started.set()
        try:
            self._loop()
        except BaseException:
            traceback.print_exc()
            self._kill_all()
        finally:
            self._finish()

    def _start_worker(self, w: NodeRun) -> None:
        if not self._processes:
            start_thread(w, self.program, self.launch_type, self._stopper, lambda: self._poke(b"t"), self._extra)
            self._registry_started(w, os.getpid())
            return
        for fd in start_process(w, self.program, self.launch_type, self._stop_r, self._req_w, self._extra):
            self._by_fd[fd] = w
            self._poller.register(fd, select.POLLIN)
        self._registry_started(w, w.pid)

    def _registry_started(self, w: NodeRun, pid: int) -> None:
        if self.registry is not None:
            self.registry.node_started(w.row, pid)

    def _registry_ended(self, w: NodeRun) -> None:
        if self.registry is not None and w.exit_code is not None:
            self.registry.node_ended(w.row, w.exit_code)

    def _loop(self) -> None:
        while True:
            if self._all_done():
                return
            timeout_ms = -1
            deadlines = [t for t in (self._kill_at, self._close_at) if t is not None]
            if deadlines:
                timeout_ms = max(0, int((min(deadlines) - time.monotonic()) * 1000) + 1)
            for fd, _ in self._poller.poll(timeout_ms):
                if fd == self._req_r:
                    self._on_requests()
                    continue
                w = self._by_fd.get(fd)
                if w is None:
                    continue
                if fd == w.pidfd:
                    self._reap(w)
                else:
                    self._read(w, fd)
            if self._close_at is not None and time.monotonic() >= self._close_at:
                self._close_data_nodes()
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                self._on_notice_expired()

    def _all_done(self) -> bool:
        return all(w.ended() for w in self._workers)

    def _on_requests(self) -> None:
        try:
            data = os.read(self._req_r, 4096)
        except BlockingIOError:
            return
        for b in data:
            c = chr(b)
            if c == "s":
                self._begin_stop()
            elif c == "i":
                self._interrupts += 1
                if self._interrupts == 1:
                    say("User-requested termination. Asking nodes to stop.")
                    say("Press Ctrl+C again to terminate immediately.")
                    self._begin_stop()
                else:
                    say("Killing every node now.")
                    self._kill_all()
        for w in self._workers:
            if w.thread is not None and w.done and not w.reported:
                w.exit_code = 0 if w.exception is None else 1
                self._registry_ended(w)
                with self._cond:  # wait() must never see the node ended before its failure is recorded
                    if w.exception is not None:
                        self._fail(w, w.exception)
                    w.reported = True
                    self._cond.notify_all()

    def _read(self, w: NodeRun, fd: int) -> bool:
        """Forward what ``fd`` has; False when it had nothing (closed if at its end)."""
        got = w.forward(fd)
        if got is None:
            self._close_fd(w, fd)
        return bool(got)

    def _close_fd(self, w: NodeRun, fd: int) -> None:
        with contextlib.suppress(KeyError):
            self._poller.unregister(fd)
        self._by_fd.pop(fd, None)
        w.close_fd(fd)

    def _reap(self, w: NodeRun) -> None:
        # The node has exited; unreaped, its pid cannot be reused, so its process group
        # is still the node's: end what it left behind (grandchildren that ignored
        # SIGTERM, daemons it did not wait for) before the pid is let go.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, signal.SIGKILL)
        janitor.unregister_group(w.pid)
        janitor.end_node(w.pid)  # and what it exec'd that left the group (setsid, daemons)
        try:
            _, status = os.waitpid(w.pid, 0)
            w.exit_code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            w.exit_code = w.exit_code if w.exit_code is not None else -1
        # what the node wrote before it exited is in its pipes: take it, then let go
        # (a grandchild may hold the pipes open; its later output is not waited for)
        for fd in list(w.fds):
            while fd in w.fds and self._read(w, fd):
                pass
            if fd in w.fds:
                self._close_fd(w, fd)
        self._poller.unregister(w.pidfd)
        self._by_fd.pop(w.pidfd, None)
        w.close_pidfd()
        self._registry_ended(w)
        with self._cond:  # wait() must never see the node ended before its failure is recorded
            if w.exit_code != 0:
                self._fail(w, NodeFailed(w.label, w.index, w.exit_code, w.error_text.decode("utf-8", "replace")))
            w.done = True
            self._cond.notify_all()

    def _fail(self, w: NodeRun, exc: BaseException) -> None:
        if self._stopping or self._failure is not None:
            return  # what ends during a stop is not a failure
        self._failure = exc
        self._failed_worker = w
        text = w.error_text.decode("utf-8", "replace").rstrip()
        if isinstance(exc, NodeFailed):
            say(str(exc))
        else:
            say(f"Error in node '{w.name}':\n{text}")
        self._begin_stop()

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self.registry is not None:
            self.registry.set_phase(PHASE_STOPPING)
        if self._notice >= 0:
            self._kill_at = time.monotonic() + self._notice
        launcher_fds.discard(self._stop_w)
        os.close(self._stop_w)
        self._stop_w = -1
        grace = CLOSE_GRACE_S if self._notice < 0 else min(CLOSE_GRACE_S, self._notice / 2)
        self._close_at = time.monotonic() + grace
        threading.Thread(target=self._stopper.trigger, name="shmpad-stop-handlers", daemon=True).start()
        self._notify()

    def _close_data_nodes(self) -> None:
        self._close_at = None
        for node in self._nodes:
            try:
                node.on_stop()
            except Exception:
                traceback.print_exc()

    def _on_notice_expired(self) -> None:
        alive = [w for w in self._workers if not w.done]
        self._kill_at = None
        if not alive:
            return
        say(
            f"Nodes that did not stop within the termination notice ({self._notice} s): {[w.name for w in alive]}; killing them."
        )
        self._kill_all()

    def _kill_all(self) -> None:
        for w in self._workers:
            if w.done:
                continue
            if w.pid is not None:
                # the node leads its process group: killing the group ends what it started
                for kill in (os.killpg, os.kill):
                    try:
                        kill(w.pid, signal.SIGKILL)
                    except OSError as e:
                        if e.errno != errno.ESRCH:
                            raise
            else:
                w.done = w.reported = True  # a thread cannot be killed: abandon it (it is a daemon)
        self._notify()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _finish(self) -> None:
        if self.registry is not None:
            self.registry.set_phase(PHASE_ENDED)
        with self._cond:
            self._ending = True
            hooks = list(self._end_hooks)
        for hook in hooks:
            try:
                hook()
            except Exception:
                traceback.print_exc()
        with self._cond:
            self._hooks_run = True
            self._cond.notify_all()
        for node in self._nodes:
            try:
                node.free()
            except Exception:
                traceback.print_exc()
        if self.registry is not None:
            self.registry.close()
        for w in self._workers:
            for fd in list(w.fds):
                self._close_fd(w, fd)
            if w.pidfd is not None:
                launcher_fds.discard(w.pidfd)
                os.close(w.pidfd)
                w.pidfd = None
        for fd in (self._stop_w, self._stop_r, self._req_r):
            if fd >= 0:
                launcher_fds.discard(fd)
                os.close(fd)
        self._stop_w = self._stop_r = self._req_r = -1
        with self._poke_lock:
            os.close(self._req_w)
            self._req_w = -1
        if not self._stopper.event.is_set():
            self._stopper.trigger()
        if self._failure is None:
            atexit.unregister(self._wait_at_exit)
        if context._process_context is self._ctx:
            context.set_process_context(None)
        with self._cond:
            self._finished = True
            self._cond.notify_all()
