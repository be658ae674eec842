"""What every benchmark family shares: its command line from a dataclass (``cli``), its
children and their ends (``harness``), its targets and exit status (``report``), and the
subjects it measures (``subject``)."""
