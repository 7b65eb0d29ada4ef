"""Checks a build must pass before a device sees it: sizes, bundle integrity, verify."""
