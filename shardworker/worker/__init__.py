"""The parent process: supervisor, dispatcher, the child pool and the handle on one child,
heartbeat, rescue, housekeeping, periodic jobs, the quarantine watch and metrics.

Holds database connections; never runs a handler.
"""
