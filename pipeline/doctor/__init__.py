"""``python -m pipeline doctor``: what works here, what does not, and the fix (``checks``); the
cluster check it runs in a child process (``cluster_check``)."""
