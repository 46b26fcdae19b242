"""Traffic traces: the formats, reading them as published, one generator's share of a replay,
their statistics, agent traces from OpenTelemetry."""
