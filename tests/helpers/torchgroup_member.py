"""One member of a two-member gloo ``TorchGroup`` in a process of its own (the exit test of
``tests/test_net_torchgroup.py``)::

    python tests/helpers/torchgroup_member.py RANK

It prints its mesh address, reads the other member's from stdin and forms the group
(epoch ``"x/1"``). Then rank 0 starts an allreduce that rank 1 never joins, closes the group
with the operation still in flight (a reaper holds it), prints ``closed`` and exits; rank 1
waits for a line on stdin, then closes its idle group (its sockets close: rank 0's
operation fails) and exits."""

from __future__ import annotations

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from shmpad.errors import Abandoned  # noqa: E402
from shmpad.net.mesh import Mesh  # noqa: E402
from shmpad.net.torchgroup import TorchGroup  # noqa: E402


def main() -> None:
    rank = int(sys.argv[1])
    mesh = Mesh(token="torchgroup-exit-test")
    print(mesh.address, flush=True)
    other = sys.stdin.readline().strip()
    addresses = [mesh.address, other] if rank == 0 else [other, mesh.address]
    group = TorchGroup(mesh.ring("x/1", addresses, rank, timeout=20), "gloo", "127.0.0.1", timeout=20)
    if rank == 0:

        def reduce() -> None:
            try:
                group.allreduce(np.ones(1000, np.float32))
            except Abandoned:
                pass

        thread = threading.Thread(target=reduce)
        thread.start()
        deadline = time.monotonic() + 30
        while group._work is None and time.monotonic() < deadline:
            time.sleep(0.001)
        group.close("leaving")  # the operation is still in flight: a reaper holds the group
        thread.join(30)
        print("closed", flush=True)
    else:
        sys.stdin.readline()
        group.close("leaving")
        print("closed", flush=True)
    mesh.close()


if __name__ == "__main__":
    main()
