"""SAM v1 training: :mod:`.trainer` (prompt simulation, staged encoder, the run), :mod:`.losses`
(focal, dice and IoU-prediction losses), :mod:`.prompts` (simulated points, boxes and
correction clicks), :mod:`.evaluate` (held-out mIoU) and :mod:`.data` (the COCO, SA-1B, mask
folder and synthetic datasets)."""
