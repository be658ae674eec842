"""shmpad's ring allreduce and gradient accumulator against gloo."""
