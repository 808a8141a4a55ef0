"""The generators of the built-in datasets, one module per dataset or family of datasets.

``scripts/make_datasets.py`` and ``scripts/make_code_dataset.py`` are the commands; ``common``
holds what they share (seed, splits, row shapes, stable splitting, shuffling, writing) and
``wordnet`` the WordNet reader the ``wordnet_*`` sets build on.
"""
