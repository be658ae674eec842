"""The env pool: forked env worker processes stepping environments into shared slots."""
