"""Tuning studies: NSGA-II over server flags (Optuna), each trial a server start and a ramp."""
