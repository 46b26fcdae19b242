"""What the monitor makes of the ticks: its model, verdicts, alerts, events, the fleet's lagging
replica, energy, the charts' series and the recording."""
