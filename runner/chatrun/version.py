"""chatrun's version, where every layer can read it (the public API exports it as `chatrun.__version__`)."""

VERSION = "0.1.0"

# Where the documentation (the repository's docs/ pages) is published: pyproject.toml's project.urls name it
# too (tests/test_wheel.py checks they agree). Messages that name a page, `docs/format.md`, mean DOCS_URL + "format.md".
DOCS_URL = "https://chatrun.dev/docs/"
