"""shmpad's courier calls on one host against bare transports and portal."""
