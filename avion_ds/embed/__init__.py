"""Embedding indexes of your own videos (`avion-ds embed`) and text search over them (`avion-ds search`)."""
