"""`python -m openrlhf_replay.rehearsal -- <training command>` (see the package docstring)."""
import sys

from openrlhf_replay.rehearsal.cli import main

sys.exit(main())
