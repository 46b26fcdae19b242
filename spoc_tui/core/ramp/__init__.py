"""The experiment: the SLA and the levels, the driver, each step's figures and verdict, the knee and
its inference, how they read in words, two ramps compared, a fleet planned from a knee."""
