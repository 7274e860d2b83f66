"""``make gpu-check``: every plugin's CUDA path and GPU figure in one prepared script (:mod:`benchmarks.gpu.check`)."""
