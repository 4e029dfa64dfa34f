"""Preparing data once: synthetic videos, AVION-style chunking + manifest, the integrity check."""
