"""fedtune: federated fine-tuning of large language models when clients cannot hold the large model."""

__version__ = "0.1.0"
