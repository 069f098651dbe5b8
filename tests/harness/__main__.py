"""python3 -m harness: see cli.py."""
import sys

from .cli import main

sys.exit(main())
