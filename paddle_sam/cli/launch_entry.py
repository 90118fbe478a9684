"""Script that ``python -m paddle.distributed.launch`` runs in each process (it takes a file,
not a module): ``paddle-sam train --nproc N`` points the launcher here."""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]  # no shadowing
    from paddle_sam.cli import main

    sys.exit(main())
