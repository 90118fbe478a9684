"""Shared test helpers: the tiny model sizes, tiny model pairs, the sam3 reference harness, a
threaded server."""
