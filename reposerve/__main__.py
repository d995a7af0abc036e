"""`python -m reposerve`: the same as the `reposerve` command."""

import sys

from reposerve.cli import main

sys.exit(main())
