"""A node process's title: ``shmpad: learner/0`` in ps and top, where every forked node
would otherwise show the launcher's own command line (``python -m bench.impala ...``)."""

from __future__ import annotations

import setproctitle

__all__ = ["set_node_title"]

# setproctitle finds the process's original command line on its first call, by matching
# it against sys.argv: do that now, before a launcher parses or rewrites sys.argv (absl
# apps do), or a forked node could not be titled later.
setproctitle.getproctitle()


def set_node_title(label: str, index: int) -> None:
    """Rewrite this process's command line (``/proc/self/cmdline``, what ps shows) and
    its 15-character thread name (``comm``, what top shows) to name the node."""
    setproctitle.setproctitle(f"shmpad: {label}/{index}")
