"""Host memory reused across tasks: the bounded buffer pool (``buffers``) and its allocators
(``allocators``), zeroed accumulators (``zeroed``), and a worker's chunk-read scratch
(``scratch``)."""
