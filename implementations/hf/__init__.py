"""The Hugging Face transformers built-ins."""
