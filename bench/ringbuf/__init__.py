"""shmpad's rings side by side with their peers (multiprocessing.Queue, faster-fifo, ZeroMQ...)."""
