"""What is read from result files: two ramps compared, a fleet planned from one (above the
codec, :mod:`spoc_tui.core.results`)."""
