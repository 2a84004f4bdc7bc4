"""One exception hierarchy; each class also inherits the builtin a caller would expect."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class. ``exit_code`` is what the CLI returns for it."""

    exit_code = 2


class UsageError(PipelineError, ValueError):
    """A bad option or argument value."""


class InputNotFoundError(PipelineError, FileNotFoundError):
    """An input path or URL holds no Zarr array."""


class InputError(PipelineError, ValueError):
    """An input array exists but cannot be multiplied (rank, dtype, shape)."""


class OutputExistsError(PipelineError, FileExistsError):
    """OUT exists and neither --overwrite nor --resume was given."""


class UnsafeOutputError(PipelineError, ValueError):
    """Writing OUT would touch an input or something this tool did not write."""


class MemoryBudgetError(PipelineError, ValueError):
    """No plan fits the memory budget."""


class BackendUnavailableError(PipelineError, RuntimeError):
    """The requested compute backend cannot run on the workers."""


class ClusterError(PipelineError, ConnectionError):
    """The scheduler cannot be reached or has no workers."""


class JobError(PipelineError, RuntimeError):
    """The job started but failed."""

    exit_code = 1


class VerificationError(PipelineError, ArithmeticError):
    """The product does not match A @ B within tolerance."""

    exit_code = 1
