"""python3 -m ckptd import|export ... (see ckptd/_cli.py)."""

import sys

from ._cli import main

sys.exit(main())
