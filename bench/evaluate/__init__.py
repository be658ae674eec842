"""Play a bench.impala run's checkpoint in fresh environments and say how well it plays."""
