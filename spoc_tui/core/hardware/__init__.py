"""GPUs and models: presets, GPU health and throttling, KV-cache capacity, the roofline, kernel
classes and the queueing view."""
