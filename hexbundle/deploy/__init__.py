"""`doit deploy`: a bundle pushed to a board over SSH and run there."""
