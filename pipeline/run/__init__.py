"""Run: the client side (submit, collect) and the worker side (read, multiply, write)."""
