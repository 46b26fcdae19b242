import os

__version__ = "0.2.0"
APP_NAME = "spoc-tui"
"""The folders' name (platformdirs: the config, the data, numba's cache of the compiled replay)."""

# NumPy's BLAS (OpenBLAS) keeps worker threads that spin for a while after each call: the small
# matrix products a headroom estimate or a step summary makes (a bootstrap's weights, a fit's
# least squares) kept a second core busy for nothing, about as much CPU again as the work itself
# (benchmarks/sim_speed.py read the H100 case 25 % slower than the old engine, in half its wall
# time). One thread, before NumPy loads, unless the user set it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
