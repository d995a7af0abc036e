"""``reposerve tune``: the best configuration for a model on this machine, measured.

``space`` says what may change (the knobs), ``search`` walks them, ``runner`` loads and
measures each candidate on a server through ``client`` with the ``load`` generator and
``requests``, ``configs`` and ``report`` write what was found, ``command`` runs it all.
"""
