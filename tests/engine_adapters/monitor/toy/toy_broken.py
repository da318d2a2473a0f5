"""An adapter package whose import fails, as one with a missing dependency does."""

raise ImportError("toy_broken needs libtoy, which is not installed")
