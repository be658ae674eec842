"""The actors' forward pass replayed from a CUDA graph (``actors.cuda_graphs``): on the CPU, where
nothing is captured but a call behaves as a replay does, the inputs and outputs it keeps,
and ``BatchedInference(graph=True)`` writing the same unrolls as without; on a GPU (skipped
without one), a replay against the eager forward pass, before and after new weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_actors_rollout import TinyPolicy, unrolls

from actors.cuda_graphs import CapturedForward, same_device
from learners import make_model


def _affine(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return 2 * x + y, x.sum(dim=-1)


def test_a_call_copies_its_inputs_and_returns_outputs_the_next_call_overwrites():
    forward = CapturedForward(_affine, "cpu")
    x, y = torch.ones(3, 2), torch.zeros(3, 2)
    first = forward(x, y)
    torch.testing.assert_close(first[0], torch.full((3, 2), 2.0))
    x.fill_(5.0)  # the caller's tensor, changed after the call: not what the next call reads unless given
    second = forward(torch.zeros(3, 2), torch.ones(3, 2))
    assert all(a is b for a, b in zip(first, second))  # the same static outputs, overwritten
    torch.testing.assert_close(second[0], torch.ones(3, 2))
    torch.testing.assert_close(second[1], torch.zeros(3))
    third = forward(torch.ones(4, 2), torch.ones(4, 2))  # another shape: its own inputs and outputs
    assert third[0].shape == (4, 2) and third[0] is not first[0] and forward.captures == 0  # nothing captured on a CPU


def test_a_device_without_an_index_takes_tensors_on_any_device_of_its_type():
    cuda, cuda0, cuda1, cpu = (torch.device(d) for d in ("cuda", "cuda:0", "cuda:1", "cpu"))
    assert same_device(cuda, cuda0) and same_device(cuda, cuda1) and same_device(cuda0, cuda0)
    assert not same_device(cuda0, cuda1) and not same_device(cuda, cpu) and not same_device(cpu, cuda0)
    assert same_device(cpu, torch.zeros(1).device)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ((np.zeros(3),), "input 0 must be a tensor on cpu, got ndarray"),
        ((torch.zeros(3), "x"), "input 1 must be a tensor on cpu, got str"),
    ],
)
def test_inputs_that_are_not_tensors_on_its_device_are_refused(inputs, message):
    with pytest.raises(TypeError, match=message):
        CapturedForward(_affine, "cpu")(*inputs)


@pytest.mark.parametrize(
    "model_factory",
    [
        TinyPolicy,
        lambda: make_model("mlp", (4,), 2, use_lstm=True),  # each half's core state must outlive the next call
        lambda: make_model("mlp", (4,), 2, last_action_reward=True),
    ],
    ids=["feed-forward", "lstm", "last-action-reward"],
)
def test_inference_through_the_graph_path_writes_the_same_unrolls(model_factory, shm_leak_check):
    eager, graphed = unrolls(model_factory=model_factory), unrolls(model_factory=model_factory, graph=True)
    assert eager.keys() == graphed.keys()
    for f in eager:
        np.testing.assert_array_equal(graphed[f], eager[f], err_msg=f)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_forward_pass_replays_on_a_gpu_with_the_weights_copied_into_it():
    torch.manual_seed(0)
    model = make_model("shallow", (4, 84, 84), 6).cuda().eval()
    fresh = make_model("shallow", (4, 84, 84), 6).cuda()

    def logits(obs: torch.Tensor) -> tuple[torch.Tensor]:
        return (model(obs[None]).policy_logits[0].float(),)

    forward = CapturedForward(logits, "cuda")
    obs = torch.randint(0, 255, (24, 4, 84, 84), dtype=torch.uint8, device="cuda")
    with torch.inference_mode():
        (got,) = forward(obs)
        torch.testing.assert_close(got, logits(obs)[0])
        with torch.no_grad():  # new weights, copied in place as a WeightStore pull copies them
            for p, q in zip(model.parameters(), fresh.parameters()):
                p.copy_(q)
        (got,) = forward(obs)
        torch.testing.assert_close(got, logits(obs)[0])
    assert forward.captures == 1
