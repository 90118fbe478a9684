"""Static export: PIR programs for the image encoder and the prompt decoder."""
