"""Full-size SAM 3 backbone parity: official sam3 vs paddle-sam, random weights.

Builds the released-size vision backbone (PE ViT 1008 input, patch 14, dim 1024, depth 32,
dual FPN neck) and text encoder (width 1024, 24 layers) with sam3's builder functions, draws
unit-variance projections and perturbs every tensor (tests/helpers/sam3_ref.py), converts the
weights with our converter, runs both on one image / three captions and prints cosine, max and mean
abs error per output, with the wall time of each forward. Minutes on 2 cores, ~10 GB RAM:
run by hand, not part of the test suite::

    PYTHONPATH=.:tests python benchmarks/sam3_backbone_parity.py [--threads 2] [--part vision]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--part", choices=["vision", "text", "both"], default="both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import paddle_sam  # first: applies the CPU defaults before paddle loads MKL

    paddle_sam.tune_process()  # the settings the CLI runs with

    # isort: split
    import numpy as np
    import paddle
    import torch

    from paddle_sam.convert.core import check_keys
    from paddle_sam.convert.sam3 import convert_tensors
    from paddle_sam.models.sam3.necks import Sam3DualViTDetNeck
    from paddle_sam.models.sam3.position_encoding import PositionEmbeddingSine
    from paddle_sam.models.sam3.text_encoder import VETextEncoder
    from paddle_sam.models.sam3.vitdet import ViT
    from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH, SimpleTokenizer
    from tests.helpers.sam3_ref import (
        cpu_patches,
        fan_in_init_,
        metrics,
        numpy_state_dict,
        perturb_module_,
    )

    torch.set_num_threads(args.threads)
    paddle_sam.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def load(ours, ref):
        state = convert_tensors(numpy_state_dict(ref))
        check_keys({k: tuple(v.shape) for k, v in ours.state_dict().items()}, state)
        ours.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
        ours.eval()

    def timed(fn):
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t

    def report(name, ref, ours):
        cos, mx, mean = metrics(ref, ours)
        ok = "PASS" if cos >= 0.99999 else "FAIL"
        shape = str(tuple(ref.shape))
        print(f"{name:<24} {shape:<20} cos {cos:.9f}  max {mx:.2e}  mean {mean:.2e}  {ok}")

    with cpu_patches(), torch.no_grad():
        from sam3 import model_builder as mb

        if args.part in ("vision", "both"):
            ref = mb._create_vision_backbone(enable_inst_interactivity=True).eval()
            ref.trunk.use_act_checkpoint = False
            perturb_module_(fan_in_init_(ref, args.seed), seed=args.seed)
            ours = Sam3DualViTDetNeck(
                trunk=ViT(),
                position_encoding=PositionEmbeddingSine(256),
                d_model=256,
                add_sam2_neck=True,
            )
            load(ours, ref)
            x = (
                np.random.default_rng(args.seed)
                .uniform(-1, 1, (1, 3, 1008, 1008))
                .astype("float32")
            )
            r, tr = timed(lambda: ref(torch.from_numpy(x)))
            with paddle.no_grad():
                o, to = timed(lambda: ours(paddle.to_tensor(x)))
            print(f"vision backbone forward: torch {tr:.1f} s, paddle {to:.1f} s")
            for group, name in ((0, "sam3 fpn"), (1, "sam3 pos"), (2, "sam2 fpn")):
                for level in range(4):
                    report(f"{name} level {level}", r[group][level], o[group][level])
            del ref, ours, r, o
            gc.collect()

        if args.part in ("text", "both"):
            ref = mb._create_text_encoder(str(DEFAULT_BPE_PATH)).eval()
            ref.encoder.transformer.grad_checkpointing = False
            perturb_module_(fan_in_init_(ref, args.seed + 1), seed=args.seed + 1)
            ours = VETextEncoder(d_model=256, tokenizer=SimpleTokenizer())
            load(ours, ref)
            captions = ["a yellow school bus", "the person on the left, wearing a red hat", "dog"]
            r, tr = timed(lambda: ref(captions, device="cpu"))
            with paddle.no_grad():
                o, to = timed(lambda: ours(captions))
            print(f"text encoder forward: torch {tr:.2f} s, paddle {to:.2f} s")
            assert (r[0].numpy() == o[0].numpy()).all(), "padding masks differ"
            report("text memory (resized)", r[1], o[1])
            report("text input embeds", r[2], o[2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
