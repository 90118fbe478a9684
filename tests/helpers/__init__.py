"""Shared test helpers: tiny model pairs, the sam3 reference harness, a threaded server."""
