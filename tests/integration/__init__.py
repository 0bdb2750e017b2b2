"""gmd's processes end to end: the console scripts, the demo, installs, the benchmarks."""
