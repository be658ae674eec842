"""shmpad's replay tables against their peers: inserts/s and samples/s."""
