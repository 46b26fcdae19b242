"""End-to-end tests: real `spoc` processes against the simulator on loopback (ramps, studies, signals,
hostile servers, TLS), each bounded in time and load."""
