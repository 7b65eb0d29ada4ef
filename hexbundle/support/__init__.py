"""Foundations every other package may use: errors, atomic writes, hashing, console output,
work in flight (inflight), test hooks. Imports nothing else of hexbundle."""
