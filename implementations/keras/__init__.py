"""The Keras built-ins."""
