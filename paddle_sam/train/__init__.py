"""Fine-tuning: what both families share here (the training loop in :mod:`.base`, the config
machinery in :mod:`.config` and :mod:`.families`, the dataset helpers in :mod:`.data`, the
synthetic scenes in :mod:`.synthetic`), each family's data, prompts, losses, evaluation and
trainer in :mod:`.sam_v1` and :mod:`.sam3` (their commands, ``paddle-sam train``, ``eval`` and
``synth``, are in :mod:`paddle_sam.cli.train`).

Needs the ``train`` extra (pyyaml for configs, matplotlib for curves); the rest of the package
does not import this subpackage (those commands do, when they run).
"""
