"""The job a GPU box with 16 cores runs for ``--device cuda``, resolved without a GPU: the CPU's
per-frame recipe (the table's algorithm, unchanged by the device), the machine sized for the
environments, and a trajectory ring that holds a whole round of unrolls; and the start-up line the
learner prints, read back as bench.learn reads it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from bench.impala import train
from bench.impala.plan import Plan, make_plan, queue_slots
from bench.impala.progress import seconds_since_start, startup_line, startup_seconds


def resolve(argv: list[str], cores: int):
    args = train.parse_args([*argv, "--out", "/nonexistent/run"])
    return train.resolve(args, make_plan(args, cores=cores, cpu_bf16=False))


def test_the_gpu_box_runs_the_cpu_runs_recipe_on_its_environments():
    gpu = resolve(["--device", "cuda"], cores=16)
    assert gpu.plan == Plan(
        cores=16,
        device="cuda",
        num_actors=2,
        num_workers=6,
        envs_per_worker=16,
        learner_threads=1,
        compile=False,  # eager: compiling would cost more start-up than the learner's room needs
        bf16=True,  # the precision the CPU runs that learned ran in
        pin=False,
    )
    cpu = resolve([], cores=2)  # the plan of docs/results/pong-rl-games-cpu's runs, 64 environments
    # the algorithm is the table's on either device: only where it runs (compiled, bf16) differs
    assert dataclasses.replace(gpu.learner, compile=cpu.learner.compile, bf16=cpu.learner.bf16) == cpu.learner
    assert gpu.unroll_length == cpu.unroll_length == 128
    steps = gpu.learner.epochs * gpu.learner.minibatches
    frames = gpu.learner.batch_size * gpu.unroll_length * gpu.learner.frames_per_step
    assert (frames, steps, frames // steps) == (32_768, 16, 2_048)  # frames per optimiser step, as on the CPU
    # 192 environments are 3 batches; the ring holds the round of unrolls they finish together
    envs = gpu.plan.num_actors * gpu.plan.num_workers * gpu.plan.envs_per_worker
    assert (envs, gpu.queue_slots, cpu.queue_slots) == (192, 192, 64)


@pytest.mark.parametrize(
    "argv, cores, slots",
    [
        ([], 16, 64),  # APPO on a CPU: one batch, however many environments (8 workers x 16 here)
        (["--device", "cuda"], 8, 128),  # 1 actor x 6 workers x 16 = 96 environments: 2 whole batches
        (["--device", "cuda", "--envs-per-worker", "2"], 16, 64),  # 24 environments: still one batch
        (["--device", "cuda", "--envs-per-worker", "11"], 16, 192),  # 132 environments: rounded up to batches
        (["--device", "cuda", "--queue-slots", "64"], 16, 64),  # given: kept
        (["--device", "cuda", "--algo", "impala"], 16, 128),  # IMPALA: 4 batches of 32 on any device
    ],
)
def test_the_ring_holds_a_batch_on_a_cpu_and_a_round_of_unrolls_on_a_gpu(argv, cores, slots):
    job = resolve(argv, cores)
    assert job.queue_slots == slots
    if "--queue-slots" not in argv:
        assert queue_slots(job.learner.algo, job.learner.batch_size, job.plan) == slots


def test_the_plan_keeps_what_the_command_line_gives_on_a_gpu():
    job = resolve(["--device", "cuda", "--compile", "on", "--bf16", "off", "--num-actors", "1"], cores=16)
    assert (job.plan.compile, job.plan.bf16, job.plan.num_actors) == (True, False, 1)


def test_the_start_up_line_reads_back():
    text = f"plan ...\n[learner/0] {startup_line(12.345)}\nframes ...\n[learner/0] {startup_line(3.0)}\n"
    assert startup_line(12.345) == "start-up: 12.3 s from the command to the first learner update"
    assert startup_seconds(text) == 3.0  # a resumed run's log holds a line per stretch: the last one
    assert startup_seconds("frames 1 fps 2\n") is None


def test_a_process_knows_how_long_ago_it_started():
    """What a fresh interpreter reports after importing the job's modules: more than nothing, and no
    more than the time the parent saw it take from start to finish."""
    begun = time.monotonic()
    code = "from bench.impala.progress import seconds_since_start; print(seconds_since_start())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    elapsed = time.monotonic() - begun
    age = float(out.stdout)
    assert 0 < age <= elapsed + 0.02, (age, elapsed)  # /proc counts in clock ticks of 10 ms
    assert seconds_since_start() > 0  # this process, too


def test_a_learner_counts_a_wait_that_found_no_batch():
    """On a GPU the learner takes a round of unrolls, then waits for the next one, often past its
    1 s timeout: that wait is waiting too, or the progress line's wait share reads low and its
    ms per update counts the idle time."""
    from actors.trajectory import trajectory_spec
    from learners.learner import Learner
    from shmpad import Timeout
    from shmpad.ringbuf import TypedRing

    job = resolve(["--env", "CartPole-v1"], cores=2)
    spec = job.env.spec()
    ring = TypedRing.create(trajectory_spec(spec, job.unroll_length), job.queue_slots)
    try:
        learner = Learner(train.build_model(job, spec.obs_shape, spec.num_actions), ring, job.learner)
        with pytest.raises(Timeout):
            learner.step(timeout=0.05)  # an empty ring
        assert learner.statistics().wait_seconds > 0
    finally:
        ring.close()
