"""DQN on CartPole as a Launchpad program: a batched policy server and a prioritized replay node."""
