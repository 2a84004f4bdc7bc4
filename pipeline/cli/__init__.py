"""The command line: the parser (``parser``) and the commands over the Python API (``main``)."""
