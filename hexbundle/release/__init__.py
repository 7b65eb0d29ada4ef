"""Release builds: reproducible archive, provenance, verification; the offline kit."""
