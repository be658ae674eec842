"""The main job and the benchmarks, one package per family, each run as ``python -m bench.<family>``:

- the job: ``impala`` (``impala.compare`` and ``impala.throughput`` measure it), ``evaluate``
  (a run's checkpoint played in fresh environments), ``learn`` (frames and wall-clock to a
  target score over seeds), ``soak`` (hours of the job with its process tree sampled);
- examples of programs: ``dqn`` (Launchpad's model: a batched policy server and a replay node);
- several learners under faults: ``elastic`` (the steps/s a group keeps while members are killed);
- several hosts on this machine: ``hosts`` (network namespaces behind links of a chosen rate and
  delay, running the several-hosts commands);
- shmpad against its peers, side by side: ``envpool``, ``replay``, ``ringbuf``, ``rpc``,
  ``allreduce``, ``portal``.

``common`` holds what they share."""
