"""Processes: free ports, process groups, starting a server and waiting for it, the guard
that stops a server whose parent died, and servers left behind by a killed study."""
