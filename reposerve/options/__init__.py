"""The flags of ``reposerve``, each declared once in ``table.OPTIONS``: the parser and
``reposerve --help`` (``parser``), the Settings they make and the start-up refusals
(``resolve``), and the CLI reference page (``tools/cli_reference.py``, docs/cli.md) are
all built from it. Importing the table builds no parser and reads no arguments, so an
in-process API can take its options from it too."""
