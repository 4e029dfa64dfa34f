"""Datasets: the clip dataset base and EPIC-Kitchens (``clip``), Kinetics, SSv2, unlabelled videos,
the locked evaluation protocols, quarantine lists and the ``build_dataset`` factory."""
