"""SAM 2 / 2.1 predictors (upstream: sam2/sam2_image_predictor.py)."""
