"""A forward pass replayed from a CUDA graph: the actors' small-batch inference without the
launch of every kernel from Python.

An actor's batch is a few dozen observations, so on a GPU its forward pass is bound by
launching kernels (each conv, activation and matmul one launch from Python), not by computing
them. ``CapturedForward(fn)`` records ``fn``'s kernels once per input signature (shapes and
dtypes) into a ``torch.cuda.CUDAGraph``, after a few warm-up calls on a side stream (cuDNN
chooses its algorithms there), and from then on copies each call's inputs into the graph's
static input tensors and replays it: one launch for the whole pass.

What a replay reads and returns:

- It reads the module's parameters where they live, so weights copied *in place* into them
  (``shmpad.weights.WeightStore.pull`` does) are what the next replay uses. Replacing a
  parameter tensor instead would leave the graph reading the old one.
- It returns the graph's static output tensors, which the next call overwrites: take what
  is needed (to the host, or ``clone``) before calling again.
- ``fn`` is captured as it runs, so it must be a pure function of its tensor inputs and the
  module's parameters: no host synchronisation, no data-dependent control flow, no
  randomness (actions are sampled from the logits outside the graph). Under autocast it
  must disable autocast's weight cache (``cache_enabled=False``), else a graph would keep
  casts of the weights it was captured with.

On a CPU nothing is captured, but a call behaves as a replay does: ``fn`` runs on the same
static input tensors and its outputs are copied into static output tensors, which are
returned and overwritten by the next call. That path costs a copy per input and output and
exists so that everything around the capture (which inputs, which outputs, what must be
cloned) runs the same on the CPU, where the tests run.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["CapturedForward", "same_device"]

WARMUP_CALLS = 3
"""calls on a side stream before a capture (torch's CUDA-graph notes use 3; cuDNN's autotuner
and lazy initialisation happen there, not in the graph)"""


def same_device(expected: torch.device, actual: torch.device) -> bool:
    """Whether a tensor on ``actual`` is on ``expected``: ``cuda`` (no index) is any CUDA device,
    as a tensor's own device always has its index (``cuda:0``)."""
    return actual.type == expected.type and (expected.index is None or actual.index == expected.index)


class CapturedForward:
    """``fn(*tensors) -> tuple of tensors``, replayed from one CUDA graph per input signature
    on ``device`` (module docstring). ``captures`` counts the graphs recorded."""

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], device: str | torch.device):
        self.fn = fn
        self.device = torch.device(device)
        self.captures = 0
        self._graphs: dict[tuple, tuple[list[torch.Tensor], tuple[torch.Tensor, ...], object]] = {}
        self._pool = None  # the graphs share one memory pool (they never replay at once)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor) or not same_device(self.device, x.device):
                raise TypeError(
                    f"CapturedForward on {self.device}: input {i} must be a tensor on {self.device}, "
                    f"got {type(x).__name__}{' on ' + str(x.device) if isinstance(x, torch.Tensor) else ''}"
                )
        key = tuple((tuple(x.shape), x.dtype) for x in inputs)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(inputs)
        static_inputs, outputs, graph = entry
        for static, x in zip(static_inputs, inputs):
            static.copy_(x)
        if graph is None:  # the CPU: no graph, the same static inputs and outputs
            for static, out in zip(outputs, self.fn(*static_inputs)):
                static.copy_(out)
        else:
            graph.replay()
        return outputs

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...], object]:
        static_inputs = [x.clone() for x in inputs]
        if self.device.type != "cuda":
            return static_inputs, tuple(out.clone() for out in self.fn(*static_inputs)), None
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.fn(*static_inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = tuple(self.fn(*static_inputs))
        self.captures += 1
        return static_inputs, outputs, graph
