"""The results files (the only writer), environment facts, the vocabularies."""
