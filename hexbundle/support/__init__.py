"""Foundations every other package may use: errors, atomic writes, hashing, console output,
test hooks. Imports nothing else of hexbundle."""
