"""SAM v1 predictors (upstream: segment_anything/predictor.py, automatic_mask_generator.py)."""
