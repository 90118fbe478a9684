"""Fine-tuning: datasets, synthetic scenes, prompt simulation, losses, the trainer and its CLI.

Needs the ``train`` extra (pyyaml for configs, matplotlib for curves); the rest of the package
does not import this subpackage.
"""
