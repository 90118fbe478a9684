"""SAM 3 image model (facebookresearch/sam3) in PaddlePaddle."""
