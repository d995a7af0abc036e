import sys

from reposerve.cli import main

sys.exit(main())
