"""SAM 2 / 2.1: the Hiera image encoder with its FPN neck, and ``SAM2Base``."""
