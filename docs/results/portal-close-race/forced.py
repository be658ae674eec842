"""The race of portal's BatchServer.close, forced: a batch is in the worker when close is called.

    python docs/results/portal-close-race/forced.py portal          # close() unbounded
    python docs/results/portal-close-race/forced.py portal 5        # close(5)
    python docs/results/portal-close-race/forced.py shmpad.portal

A BatchServer of batch 2 whose work function takes 1 s; two clients each call it once, so one
batch goes to the work function; close is called while it runs. Prints how long close took, or
that it had not returned after 20 s. Then ends every child process it left, by pid.
"""

import importlib
import os
import signal
import sys
import threading
import time

import numpy as np

working = threading.Event()


def workfn(x):
    working.set()
    time.sleep(1.0)
    return x


def main():
    impl = sys.argv[1]
    bound = float(sys.argv[2]) if len(sys.argv) > 2 else None
    portal = importlib.import_module(impl)
    port = portal.free_port()
    server = portal.BatchServer(port, name="Forced")
    server.bind("f", workfn, None, 2, 1)
    server.start(block=False)
    clients = [portal.Client(f"127.0.0.1:{port}", f"Client{i}", autoconn=False) for i in range(2)]
    for c in clients:
        c.connect()
    for c in clients:
        c.f(np.zeros(3, np.float32))  # the second call completes the batch
    assert working.wait(30), "the batch never reached the work function"
    closed = threading.Event()
    began = time.monotonic()
    took = []

    def close():
        server.close(bound)
        took.append(time.monotonic() - began)
        closed.set()

    threading.Thread(target=close, daemon=True).start()
    if closed.wait(20):
        print(f"{impl} close({bound}): returned after {took[0]:.2f} s", flush=True)
    else:
        print(f"{impl} close({bound}): still closing after 20 s", flush=True)
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
