"""Rank-aware process helpers below models and data: process group, rank / world, ZeRO readers, rng, logging."""
