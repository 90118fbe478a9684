"""SAM 2's video tracker trained on synthetic clips (``family: sam2`` configs)."""
