"""Environment frames/s of shmpad's env pool against its peers and the ceiling."""
