"""`doit bench`: side-by-side measurements of the build."""
