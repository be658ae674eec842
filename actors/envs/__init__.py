"""Environments as the env workers step them: the spec they declare, their config,
Atari (ALE) and gymnasium adapters, and the exact area resize."""
