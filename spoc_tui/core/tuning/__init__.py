"""Tuning studies, the pure part: search spaces, engine flags, the Pareto front and the noisy front."""
