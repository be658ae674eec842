"""A Pong APPO minibatch's frames taken out of the batch ([129, 64, 4, 84, 84] uint8, 16 columns,
one torch thread): advanced indexing and index_select into new tensors, index_select into a kept
one; the mean of 4 takes after one. Run alone, and under THP_MEM_ALLOC_ENABLE=1 (torch's
allocator then asks for transparent huge pages for large tensors).

    python docs/results/learner-cost-cpu/take.py
"""

from __future__ import annotations

import time

import torch

torch.set_num_threads(1)
frames = torch.randint(0, 255, (129, 64, 4, 84, 84), dtype=torch.uint8)
columns = torch.randperm(64)[:16]
kept = torch.empty(129, 16, 4, 84, 84, dtype=torch.uint8)


def seconds(take) -> float:
    take()
    start = time.perf_counter()
    for _ in range(4):
        take()
    return (time.perf_counter() - start) / 4


print(f"frames[:, columns]            {seconds(lambda: frames[:, columns]) * 1e3:6.1f} ms")
print(f"index_select, a new tensor    {seconds(lambda: frames.index_select(1, columns)) * 1e3:6.1f} ms")
print(
    f"index_select into a kept one  {seconds(lambda: torch.index_select(frames, 1, columns, out=kept)) * 1e3:6.1f} ms"
)
