"""Fine-tuning: datasets, synthetic scenes, prompt simulation, losses and the trainer (its
commands, ``paddle-sam train``, ``eval`` and ``synth``, are in :mod:`paddle_sam.cli.train`).

Needs the ``train`` extra (pyyaml for configs, matplotlib for curves); the rest of the package
does not import this subpackage (those commands do, when they run).
"""
