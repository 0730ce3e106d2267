"""The modules whose checks `run_preflight` runs; importing one registers its checks."""
