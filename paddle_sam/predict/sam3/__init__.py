"""SAM 3 predictors (upstream: sam3/model/sam3_image_processor.py) and the text tokenizer."""
