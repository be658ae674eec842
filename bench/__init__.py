"""The main job and the benchmarks, one package per family, each run as ``python -m bench.<family>``:
``impala`` (the job; ``impala.compare`` and ``impala.throughput`` measure it), ``evaluate``, ``dqn``,
and the benchmarks of shmpad against its peers: ``envpool``, ``replay``, ``ringbuf``, ``rpc``,
``allreduce``. ``common`` holds what they share."""
