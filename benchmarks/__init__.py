"""Measured ratios of the product against the simplest way to do the same work (not timed tests).

    bash benchmarks/run.sh            # every benchmark, a table on stdout, JSON in build/benchmarks/results.json
    bash benchmarks/run.sh --quick    # tiny sizes: checks that every benchmark runs
    bash benchmarks/gpu_check.sh      # on a GPU machine: the loop under torchrun in bf16, throughput and MFU

Each ratio is ours over the baseline, both measured in the same run, alternating, so that whatever else the
machine does at the time hits both sides.
"""
