"""``python -m shmpad.top``: a live view of a running shmpad program on this host.

It reads the program's registry (``shmpad.top.registry``) and, through it, the
counters the program keeps in shared memory anyway: its rings' ``statistics()``, its
weight stores' version and pull count, the request rings of its courier nodes and
their servers' call counters (``shmpad.rpc.stats``), the counters its nodes publish
(``shmpad.publish_counter``), and each node process's CPU time and resident memory
from ``/proc``. It only loads words: the program does not
notice it. The launcher's ``shmpad.launch.live`` draws the same view under the
program's output in the launching terminal (``launch(..., top=True)``).
"""
