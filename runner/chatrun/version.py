"""chatrun's version, where every layer can read it (the public API exports it as `chatrun.__version__`)."""

VERSION = "0.1.0"
