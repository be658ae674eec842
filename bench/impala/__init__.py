"""IMPALA on Atari with shmpad, the project's main job, and the benchmarks that measure it."""
