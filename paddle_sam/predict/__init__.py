"""Predictors: numpy in, numpy out, the image embedding cached across prompts."""
